// A deterministic parallel loop: [0, n) is cut into the same chunks whatever the thread count,
// so per-chunk partial results (summed in chunk order by the caller) never depend on --threads.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>

namespace nibble::kernels {

// Number of worker threads used by parallel_for; 0 means hardware concurrency.
void set_num_threads(int n);
int num_threads();

// Calls fn(chunk_index) for every chunk in [0, chunks), spread over the worker threads.
// The first exception thrown by any chunk is rethrown on the calling thread.
void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn);

// The CPU seconds a piece of work used: the constructing thread's, and every worker thread parallel_for
// starts for it (nested calls included), from construction on. Work that shares the cores with other work
// (calibration beside the search) is measured by what it did, not by the wall time the other work held.
// One per thread at a time may collect (the newest; the one before it resumes when it ends).
class CpuTally {
 public:
  CpuTally();
  ~CpuTally();
  CpuTally(const CpuTally&) = delete;
  CpuTally& operator=(const CpuTally&) = delete;
  double seconds() const;
  // For parallel_for: the tally the calling thread collects into (null: none), and a worker's own CPU time.
  static CpuTally* current();
  static void set_current(CpuTally* t);
  void add_worker_nanoseconds(int64_t ns);

 private:
  CpuTally* previous_;
  int64_t start_ns_;
  std::atomic<int64_t> worker_ns_{0};
};

}  // namespace nibble::kernels

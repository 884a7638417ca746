// The weights of one pass, read one ahead of the one being quantized, in one of two ways (Reading):
// - kCopy (a device's staging copies each weight anyway): while weight i is quantized, a thread of its
//   own reads weight i + 1 from its external data file (parallel_pread) into a buffer reused from weight
//   to weight, so the staging reads host memory that is already there;
// - kMapAhead (the CPU, whose kernels read the weight where it is): the view is the memory map's, and a
//   thread of its own maps weight i + 1's pages of the page cache ahead (MADV_POPULATE_READ), so the
//   kernels neither copy the weight (2 bytes written and read again per fp16 weight) nor fault on it.
//   Where the kernel has no MADV_POPULATE_READ (Linux < 5.14) the stream falls back to kCopy.
#pragma once
#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loaders/onnx_model.h"
#include "loaders/parallel_read.h"

namespace nibble {

class WeightStream {
 public:
  enum class Reading { kCopy, kMapAhead };
  // `names`: initializers in the order they will be taken. `read[i]`: whether weight i is read into a
  // buffer; where not (a copy already on the device, a replayed layer), take(i) gives the map's view,
  // whose pages nothing touches unless someone reads them. `threads`: readers per weight (kCopy).
  WeightStream(OnnxModel& model, std::vector<std::string> names, std::vector<bool> read, int threads,
               Reading how = Reading::kCopy);
  ~WeightStream();  // waits for a read in flight (its buffer and file must outlive it)
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  // Weight i's view, checked as OnnxModel::view checks it: with kCopy its bytes in a buffer the view holds
  // (returned to the pool when the last copy of the view goes), with kMapAhead the map's pages, mapped. Then starts reading weight i + 1. Weights taken in
  // order are read ahead; one taken out of order is read at once. A failed read throws here, for the
  // weight it was reading.
  TensorView take(size_t i);
  ReadStats stats() const;

 private:
  struct Pool;
  struct File;
  void start(size_t i);
  int file_of(const TensorView& v, const std::string& path);
  std::future<TensorView> copy_ahead(TensorView v, int fd, const std::string& path);
  std::future<TensorView> map_ahead(TensorView v, int fd, const std::string& path);
  void count(const TensorView& v, double seconds);

  OnnxModel& model_;
  std::vector<std::string> names_;
  std::vector<bool> read_;
  int threads_;
  std::atomic<Reading> how_;  // kMapAhead turns to kCopy where the kernel cannot map ahead
  std::shared_ptr<Pool> pool_;
  std::vector<std::unique_ptr<File>> files_;  // opened once each, by path
  size_t ahead_index_ = 0;
  std::future<TensorView> ahead_;  // the read of weight ahead_index_, when valid
  mutable std::mutex stats_mutex_;  // the reading thread adds its seconds, the taking one its waits
  ReadStats stats_;
};

}  // namespace nibble

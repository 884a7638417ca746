// A deterministic parallel loop: [0, n) is cut into the same chunks whatever the thread count,
// so per-chunk partial results (summed in chunk order by the caller) never depend on --threads.
#pragma once
#include <cstdint>
#include <functional>

namespace nibble::kernels {

// Number of worker threads used by parallel_for; 0 means hardware concurrency.
void set_num_threads(int n);
int num_threads();

// Calls fn(chunk_index) for every chunk in [0, chunks), spread over the worker threads.
// The first exception thrown by any chunk is rethrown on the calling thread.
void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn);

}  // namespace nibble::kernels

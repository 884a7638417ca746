#include "kernels/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace nibble::kernels {

static std::atomic<int> g_threads{0};

void set_num_threads(int n) { g_threads = std::max(0, n); }

int num_threads() {
  const int n = g_threads.load();
  if (n > 0) return n;
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_for(int64_t chunks, const std::function<void(int64_t)>& fn) {
  const int64_t workers = std::min<int64_t>(num_threads(), chunks);
  if (workers <= 1) {
    for (int64_t i = 0; i < chunks; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (int64_t i; !failed && (i = next.fetch_add(1)) < chunks;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace nibble::kernels

#include "kernels/parallel.h"

#include <time.h>

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

namespace {

thread_local CpuTally* t_tally = nullptr;

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + int64_t(ts.tv_nsec);
}

}  // namespace

CpuTally::CpuTally() : previous_(t_tally), start_ns_(thread_cpu_ns()) { t_tally = this; }

CpuTally::~CpuTally() {
  t_tally = previous_;
  if (previous_) previous_->add_worker_nanoseconds(worker_ns_.load());  // its own clock has this thread's
}

double CpuTally::seconds() const { return 1e-9 * double(thread_cpu_ns() - start_ns_ + worker_ns_.load()); }

CpuTally* CpuTally::current() { return t_tally; }
void CpuTally::set_current(CpuTally* t) { t_tally = t; }
void CpuTally::add_worker_nanoseconds(int64_t ns) { worker_ns_ += ns; }

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
  CpuTally* tally = CpuTally::current();
  for (int64_t t = 1; t < workers; ++t)
    pool.emplace_back([&work, tally] {
      CpuTally::set_current(tally);  // nested parallel_for calls collect into it too
      work();
      if (tally) tally->add_worker_nanoseconds(thread_cpu_ns());  // a fresh thread: its whole CPU time
    });
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace nibble::kernels

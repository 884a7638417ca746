// kernels::parallel_for and kernels::CpuTally: the CPU time of a piece of work counts its workers'.
#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <thread>

#include "kernels/parallel.h"

using namespace nibble::kernels;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// `seconds` of CPU time on the calling thread (by its own clock: however busy the machine is).
void spin_cpu(double seconds) {
  const double end = thread_cpu_seconds() + seconds;
  volatile double x = 1.0;
  while (thread_cpu_seconds() < end) x = x * 1.0000001 + 1e-9;
}

}  // namespace

TEST(ParallelFor, CallsEveryChunkOnce) {
  set_num_threads(3);
  std::atomic<int> hits[100] = {};
  parallel_for(100, [&](int64_t i) { hits[i]++; });
  set_num_threads(0);
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(CpuTally, CountsTheWorkersOfNestedLoops) {
  set_num_threads(2);
  CpuTally outer;
  double inner_seconds = 0.0;
  {
    CpuTally inner;
    // 4 chunks of 0.05 s each, on two threads, the second level nested: 0.2 s of CPU in all at least.
    parallel_for(2, [&](int64_t) { parallel_for(2, [&](int64_t) { spin_cpu(0.05); }); });
    inner_seconds = inner.seconds();
  }
  const double outer_seconds = outer.seconds();
  set_num_threads(0);
  EXPECT_GE(inner_seconds, 0.19);
  EXPECT_LT(inner_seconds, 5.0);
  EXPECT_GE(outer_seconds, inner_seconds);  // the inner tally's workers reach the outer one when it ends
  EXPECT_EQ(CpuTally::current(), &outer);
}

TEST(CpuTally, OtherThreadsWorkIsNotCounted) {
  CpuTally tally;
  std::thread other([] { spin_cpu(0.2); });  // not started by parallel_for for this tally
  other.join();
  EXPECT_LT(tally.seconds(), 0.1);
}

// The layer engine's product with a 16-bit weight (forward::matmul_widening) against the same product on
// the weight already widened to float32 (forward::matmul_parallel): what reading fp16/bf16 weights costs
// beyond the sgemm arithmetic, on 7B-layer shapes by default. Benchmarks measure; nothing here asserts,
// but each output is compared bit for bit with the float32 product's (they must be equal).
//
//   build/bench_kernel_widening [--M 1024] [--shapes 4096x4096,4096x11008,11008x4096] [--reps 3] [--threads 2]
//
// Weights: N(0, 0.02) fp16 from a fixed seed, [K, N]; activations N(0, 1). GFLOP/s count 2·M·K·N.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "forward/matmul.h"
#include "kernels/forward_types.h"
#include "kernels/half_float.h"
#include "kernels/parallel.h"

using namespace nibble;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Shape {
  int64_t K, N;
};

std::vector<Shape> parse_shapes(const std::string& s) {
  std::vector<Shape> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto x = item.find('x');
    if (x == std::string::npos) continue;
    out.push_back({std::atoll(item.substr(0, x).c_str()), std::atoll(item.substr(x + 1).c_str())});
  }
  return out;
}

// The best and the median of `reps` timings of fn.
template <class Fn>
std::pair<double, double> timed(int reps, Fn fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    fn();
    t.push_back(now() - t0);
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

void run_shape(int64_t M, Shape s, int reps) {
  std::mt19937 rng(7);
  std::normal_distribution<float> act(0.0f, 1.0f), weight(0.0f, 0.02f);
  std::vector<float> A(size_t(M * s.K));
  for (auto& a : A) a = act(rng);
  std::vector<uint16_t> B(size_t(s.K * s.N));
  std::vector<float> wide(B.size());
  for (size_t i = 0; i < B.size(); ++i) {
    B[i] = float_to_half(weight(rng));
    wide[i] = half_to_float(B[i]);
  }
  std::vector<float> C32(size_t(M * s.N)), C16(C32.size());
  forward::Floats scratch;
  const auto f32 = timed(reps, [&] {
    forward::matmul_parallel(A.data(), wide.data(), C32.data(), M, s.K, s.N, false,
                             kernels::forward_k_slice(s.N, s.K, true));
  });
  const auto f16 = timed(reps, [&] {
    forward::matmul_widening(nullptr, A.data(), DType::kFloat16, B.data(), C16.data(), M, s.K, s.N, scratch);
  });
  // As the engine reads a weight: from the model file's mapping, mapped afresh (the page cache warm).
  const char* tmp = std::getenv("TMPDIR");
  const std::string file = std::string(tmp ? tmp : "/tmp") + "/bench_kernel_widening." + std::to_string(::getpid());
  const char* path = file.c_str();
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(B.data(), 2, B.size(), f) != B.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "bench_kernel_widening: cannot write %s\n", path);
    std::exit(1);
  }
  const auto mapped = timed(reps, [&] {
    const int fd = ::open(path, O_RDONLY);
    void* p = ::mmap(nullptr, B.size() * 2, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    ::madvise(p, B.size() * 2, MADV_SEQUENTIAL);
    forward::matmul_widening(nullptr, A.data(), DType::kFloat16, static_cast<const uint16_t*>(p), C16.data(), M, s.K,
                             s.N, scratch);
    ::munmap(p, B.size() * 2);
  });
  std::remove(path);
  const double gflop = 2.0 * double(M) * double(s.K) * double(s.N) * 1e-9;
  const bool equal = std::memcmp(C32.data(), C16.data(), C32.size() * sizeof(float)) == 0;
  std::printf("%5lld x %5lld x %5lld  float32 weight %7.1f ms (%6.1f GFLOP/s, median %7.1f)  fp16 weight %7.1f ms "
              "(%6.1f GFLOP/s, median %7.1f)  fp16/float32 %.3f  outputs %s\n",
              (long long)M, (long long)s.K, (long long)s.N, 1e3 * f32.first, gflop / f32.first, 1e3 * f32.second,
              1e3 * f16.first, gflop / f16.first, 1e3 * f16.second, f16.first / f32.first,
              equal ? "equal" : "DIFFER");
  std::printf("  mapped fp16 weight %7.1f ms (median %7.1f): %.3f of float32\n", 1e3 * mapped.first, 1e3 * mapped.second,
              mapped.first / f32.first);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 1024;
  int reps = 3, threads = 2;
  std::string shapes = "4096x4096,4096x11008,11008x4096";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--M") M = std::atoll(value.c_str());
    else if (flag == "--shapes") shapes = value;
    else if (flag == "--reps") reps = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--threads") threads = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "bench_kernel_widening: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  kernels::set_num_threads(threads);
  std::printf("threads %d, M %lld, best of %d\n", kernels::num_threads(), (long long)M, reps);
  for (const Shape& s : parse_shapes(shapes)) run_shape(M, s, reps);
  return 0;
}

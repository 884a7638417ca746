// Throughput of the awq_lite loss (awq_loss, kernels/cpu/awq_fast.cc) on one 7B-layer-shaped weight, its
// parts, and plain OpenBLAS products of the same shapes (what the machine reaches). Benchmarks measure;
// nothing here asserts, but every triangular product is compared bit for bit with the first one.
//
//   build/bench_kernel_awq_loss [--K 11008] [--N 4096] [--tokens 2048] [--reps 2] [--threads 2]
//                               [--widths 256,512,1024] [--parts chol,loss,stages,trmm,gemm]
//
// Run it as nibble runs OpenBLAS: nibble's CLI picks the kernel set the CPU supports (cli/blas_startup.h),
// this program does not, so set it (OPENBLAS_CORETYPE=SkylakeX on an AVX-512 CPU); the first line says
// which set runs.
//
// Weights: N(0, 0.02) fp16 from a fixed seed, stored [K, N]. Gram: XᵀX of T random N(0, 1) token rows
// (rank min(T, K), as real calibration with T < K: the Cholesky factor then needs its diagonal shift).
// One candidate: alpha 0.5 of random channel means, the clip ratios of the nibble-mode search.
// GFLOP/s count the loss's products as the device's count_flops does: K² N for ‖U D‖² (K² N / 2 multiply-
// adds), 2 K² N for a full GEMM.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/awq_fast.h"
#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/half_float.h"
#include "kernels/parallel.h"

extern "C" void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);

using namespace nibble;
using namespace nibble::kernels;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU seconds of every thread of the process: on a shared machine, the work done, where wall seconds
// also count the time other jobs held the cores.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
double g_last_cpu = 0;  // CPU seconds of the best wall run of the last best_of

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now(), c0 = cpu_now();
    f();
    const double t = now() - t0;
    if (t < best) best = t, g_last_cpu = cpu_now() - c0;
  }
  return best;
}

// U·D in column chunks of `width`, each one single-threaded cblas_strmm on our threads (awq_loss's form).
void trmm_chunks(const std::vector<float>& u, std::vector<float>& d, int64_t K, int64_t N, int64_t width) {
  parallel_for((N + width - 1) / width, [&](int64_t c) {
    const int64_t n0 = c * width, w = std::min(N, n0 + width) - n0;
    cblas_strmm(CblasRowMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, int(K), int(w), 1.0f, u.data(),
                int(K), d.data() + n0, int(N));
  });
}

}  // namespace

int main(int argc, char** argv) {
  int64_t K = 11008, N = 4096, T = 2048;
  int reps = 2, threads = 2;
  std::string widths = "256,512,1024", parts = "chol,loss,stages,trmm,gemm";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) std::exit(2);
      return argv[++i];
    };
    if (a == "--K") K = std::stoll(next());
    else if (a == "--N") N = std::stoll(next());
    else if (a == "--tokens") T = std::stoll(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--widths") widths = next();
    else if (a == "--parts") parts = next();
    else {
      std::fprintf(stderr, "usage: %s [--K K] [--N N] [--tokens T] [--reps R] [--threads P] [--widths a,b] "
                           "[--parts chol,loss,stages,trmm,gemm]\n", argv[0]);
      return 2;
    }
  }
  auto want = [&](const char* p) { return ("," + parts + ",").find(std::string(",") + p + ",") != std::string::npos; };
  set_num_threads(threads);
  use_single_threaded_blas();
  std::printf("OpenBLAS kernel set: %s\n", openblas_get_corename());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Gram from T token rows, float64 as calibration keeps it.
  std::vector<double> x(size_t(T * K));
  for (auto& v : x) v = nd(rng);
  std::vector<double> gram(size_t(K * K), 0.0);
  openblas_set_num_threads(threads);
  double t0 = now();
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(K), int(T), 1.0, x.data(), int(K), 0.0, gram.data(), int(K));
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < i; ++j) gram[size_t(i * K + j)] = gram[size_t(j * K + i)];
  std::printf("gram: K %lld from %lld tokens, dsyrk %.2f s (OpenBLAS %d threads)\n", (long long)K, (long long)T,
              now() - t0, threads);
  openblas_set_num_threads(1);
  x.clear();
  x.shrink_to_fit();
  std::vector<float> g32(gram.begin(), gram.end());
  std::vector<float> u;
  t0 = now();
  u = gram_cholesky_upper(gram.data(), K);
  const double chol_s = now() - t0;
  std::printf("cholesky (gram_cholesky_upper, float64 dpotrf, 1 thread): %.2f s, %s\n", chol_s,
              u.empty() ? "FAILED" : "ok");
  if (u.empty()) return 1;
  if (want("chol2")) {  // the same factorisation on OpenBLAS's threads: same bits?
    openblas_set_num_threads(threads);
    const char lower = 'L';
    const int n = int(K);
    std::vector<double> a(gram);
    for (int64_t k = 0; k < K; ++k) a[size_t(k * K + k)] += 1e-12 * [&] { double m = 0; for (int64_t i = 0; i < K; ++i) m = std::max(m, gram[size_t(i * K + i)]); return m; }();
    int info = 0;
    const double c0 = now();
    dpotrf_(&lower, &n, a.data(), &n, &info);
    const double c1 = now() - c0;
    int64_t ndiff = 0;
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i; j < K; ++j) ndiff += float(a[size_t(i * K + j)]) != u[size_t(i * K + j)];
    std::printf("dpotrf shift 1e-12 on OpenBLAS %d threads: %.2f s, info %d, %lld elements of U differ\n", threads, c1, info, (long long)ndiff);
    openblas_set_num_threads(1);
  }
  gram.clear();
  gram.shrink_to_fit();

  // Weight, fp16 [K, N], and one candidate scale.
  std::normal_distribution<float> wd(0.0f, 0.02f);
  std::vector<uint16_t> h(size_t(K * N));
  for (auto& v : h) v = float_to_half(wd(rng));
  const WeightMatrix w{DType::kFloat16, h.data(), K, N, 0};
  const std::vector<float> w_kn = logical_weight(w);
  std::uniform_real_distribution<float> ud(0.1f, 2.0f);
  std::vector<float> xm(static_cast<size_t>(K)), wm(static_cast<size_t>(K));
  for (auto& v : xm) v = ud(rng);
  for (auto& v : wm) v = ud(rng);
  const std::vector<float> s = awq_scale(xm, wm, 0.5);
  QuantSpec spec;
  spec.bits = 4, spec.block = 128;
  const std::vector<float> clip = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f};
  const double tri_flops = double(K) * double(K) * double(N);
  std::printf("weight %lld x %lld fp16, block 128, threads %d; loss products %.1f GFLOP per candidate\n",
              (long long)K, (long long)N, threads, tri_flops / 1e9);

  if (want("loss")) {
    double loss = 0;
    const double t = best_of(reps, [&] { loss = awq_loss(w, w_kn, s.data(), spec, g32.data(), T, &clip, u.data()); });
    std::printf("awq_loss (one candidate): %.3f s (cpu %.3f s), %.1f GFLOP/s, loss %.17g\n", t, g_last_cpu,
                tri_flops / t / 1e9, loss);
    AwqLossWork work;  // as the backend's awq_losses runs its candidates: buffers reused
    const double tw = best_of(reps + 1, [&] {
      loss = awq_loss(w, w_kn, s.data(), spec, g32.data(), T, &clip, u.data(), &work);
    });
    std::printf("awq_loss with reused buffers: %.3f s (cpu %.3f s), %.1f GFLOP/s, loss %.17g\n", tw, g_last_cpu,
                tri_flops / tw / 1e9, loss);
  }
  std::vector<float> d;
  if (want("stages") || want("trmm")) {
    LossWeight l;
    QuantResult q;
    const double ts = best_of(reps, [&] { l = loss_weight(w, s.data(), spec, g32.data(), true); });
    const double tq = best_of(reps, [&] { rtn_quantize_weighted_fast(l.w, l.spec, l.energy.data(), clip, q); });
    const double tr = best_of(reps, [&] { d = loss_residual(l, q, w_kn, s.data()); });
    std::printf("stages: scale W*s %.3f s, weighted RTN (5 clip ratios) %.3f s, residual D %.3f s\n", ts, tq, tr);
    std::vector<double> col(static_cast<size_t>(N));
    const double tc = best_of(reps, [&] {
      parallel_for((N + 255) / 256, [&](int64_t c) {
        const int64_t n0 = c * 256, wd2 = std::min<int64_t>(N, n0 + 256) - n0;
        column_dots(d.data() + n0, d.data() + n0, K, N, wd2, col.data() + n0);
      });
    });
    std::printf("stages: column_dots %.3f s\n", tc);
  }
  if (want("trmm")) {
    std::vector<float> first;
    for (const auto& ws : split(widths)) {
      const int64_t width = std::stoll(ws);
      std::vector<float> y;
      double best = 1e30, cpu = 0;
      for (int r = 0; r < reps; ++r) {
        y = d;
        const double a = now(), c0 = cpu_now();
        trmm_chunks(u, y, K, N, width);
        if (now() - a < best) best = now() - a, cpu = cpu_now() - c0;
      }
      const char* cmp = first.empty() ? "-" : (std::memcmp(first.data(), y.data(), y.size() * 4) == 0 ? "same" : "DIFFERENT");
      if (first.empty()) first = y;
      int64_t ndiff = 0, first_k = -1, first_n = -1;
      if (first.size() == y.size())
        for (int64_t i = 0; i < K * N; ++i)
          if (std::memcmp(&first[size_t(i)], &y[size_t(i)], 4) != 0 && ndiff++ == 0) first_k = i / N, first_n = i % N;
      std::printf("strmm row-major chunks of %5lld on %d threads: %.3f s (cpu %.3f s), %.1f GFLOP/s, bits vs first: %s"
                  " (%lld differ, first at k %lld n %lld)\n",
                  (long long)width, threads, best, cpu, tri_flops / best / 1e9, cmp, (long long)ndiff,
                  (long long)first_k, (long long)first_n);
      std::fflush(stdout);
    }
  }
  if (want("gemm")) {
    // What OpenBLAS reaches on a full K x K by K x N product: our threads with single-threaded calls, and
    // OpenBLAS's own threads on one call.
    std::vector<float> b(size_t(K * N)), c(size_t(K * N));
    for (auto& v : b) v = wd(rng);
    const int64_t width = 1024;
    const double t1 = best_of(reps, [&] {
      parallel_for((N + width - 1) / width, [&](int64_t ch) {
        const int64_t n0 = ch * width, wd2 = std::min(N, n0 + width) - n0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(K), int(wd2), int(K), 1.0f, g32.data(), int(K),
                    b.data() + n0, int(N), 0.0f, c.data() + n0, int(N));
      });
    });
    std::printf("sgemm full K x K x N, chunks of %lld on our %d threads: %.3f s (cpu %.3f s), %.1f GFLOP/s\n",
                (long long)width, threads, t1, g_last_cpu, 2 * tri_flops / t1 / 1e9);
    openblas_set_num_threads(threads);
    const double t2 = best_of(reps, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(K), int(N), int(K), 1.0f, g32.data(), int(K),
                  b.data(), int(N), 0.0f, c.data(), int(N));
    });
    std::printf("sgemm full, one call, OpenBLAS %d threads: %.3f s (cpu %.3f s), %.1f GFLOP/s\n", threads, t2,
                g_last_cpu, 2 * tri_flops / t2 / 1e9);
    const double t3 = best_of(reps, [&] {
      cblas_strmm(CblasRowMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, int(K), int(N), 1.0f, u.data(),
                  int(K), b.data(), int(N));
    });
    std::printf("strmm one call, OpenBLAS %d threads: %.3f s (cpu %.3f s), %.1f GFLOP/s\n", threads, t3, g_last_cpu,
                tri_flops / t3 / 1e9);
    openblas_set_num_threads(1);
  }
  return 0;
}

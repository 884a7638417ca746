// Throughput of rtn_lsq (the default RTN's search) on one 7B-layer-shaped weight: the vectorized kernel
// (rtn_lsq_simd, per ISA), the threaded scalar one it replaces (rtn_lsq_fast, search_fast.cc) and the
// reference, in Mweights/s and GB/s of the stored weight. Benchmarks measure; nothing here asserts.
//
//   build/bench_kernel_rtn_lsq [--rows 4096] [--cols 11008] [--block 128] [--threads 1,2] [--dtype fp16]
//                              [--reps 3] [--zp] [--axis 0] [--weight magnitude|uniform|square]
//                              [--kernels simd,panels,ref] [--isa auto|generic|avx2|avx512|all]
//
// Weights: N(0, 0.02) from a fixed seed. Each figure is the best of --reps runs (--reps 1 for ref).
// Every kernel's result is compared with the first one's: a row says "same" or "DIFFERENT".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_lsq_fast.h"
#include "kernels/cpu/search_fast.h"
#include "kernels/cpu/search_ref.h"
#include "kernels/parallel.h"

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

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--rows R] [--cols C] [--block B] [--threads 1,2] [--dtype fp32|fp16|bf16] [--reps N] "
                       "[--zp] [--axis 0|1] [--weight magnitude|uniform|square] [--kernels simd,panels,ref] "
                       "[--isa auto|generic|avx2|avx512|all]\n", argv0);
  std::exit(2);
}

bool same(const QuantResult& a, const QuantResult& b) {
  return a.codes == b.codes && a.zero_points == b.zero_points && a.scales.size() == b.scales.size() &&
         std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * sizeof(float)) == 0 &&
         std::memcmp(&a.sq_error, &b.sq_error, sizeof(double)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096, cols = 11008, block = 128;
  int reps = 3, axis = 0;
  bool zp = false;
  std::string threads = "1,2", dtype = "fp16", kernels = "simd,panels", isas = "auto", weight = "magnitude";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0]);
      return argv[++i];
    };
    if (a == "--rows") rows = std::stoll(next());
    else if (a == "--cols") cols = std::stoll(next());
    else if (a == "--block") block = std::stoll(next());
    else if (a == "--threads") threads = next();
    else if (a == "--dtype") dtype = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--axis") axis = std::stoi(next());
    else if (a == "--zp") zp = true;
    else if (a == "--weight") weight = next();
    else if (a == "--kernels") kernels = next();
    else if (a == "--isa") isas = next();
    else usage(argv[0]);
  }
  const DType t = dtype == "fp32" ? DType::kFloat32 : dtype == "bf16" ? DType::kBFloat16 : DType::kFloat16;
  RtnSearchOptions opt;
  opt.weight = weight == "uniform" ? FitWeight::kUniform : weight == "square" ? FitWeight::kSquare : FitWeight::kMagnitude;
  const size_t n = size_t(rows * cols);
  std::vector<float> f(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (auto& v : f) v = d(rng);
  std::vector<uint16_t> h;
  if (t != DType::kFloat32) {
    h.resize(n);
    for (size_t i = 0; i < n; ++i) h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
  }
  const WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), rows, cols, axis};
  const double bytes = double(n) * (t == DType::kFloat32 ? 4 : 2);
  QuantSpec spec;
  spec.bits = 4, spec.block = block, spec.zero_point = zp;
  std::vector<RtnIsa> isa_list;
  for (const auto& s : split(isas))
    for (RtnIsa i : {RtnIsa::kAuto, RtnIsa::kGeneric, RtnIsa::kAvx2, RtnIsa::kAvx512})
      if (s == rtn_isa_name(i) || (s == "all" && i != RtnIsa::kAuto)) isa_list.push_back(i);
  std::printf("kernel         dtype  threads  shape        block  mode  best_s     Mweights/s  GB/s    vs first\n");
  for (const auto& ts : split(threads)) {
    set_num_threads(std::stoi(ts));
    QuantResult first;
    bool have_first = false;
    for (const auto& k : split(kernels))
      for (size_t ii = 0; ii < (k == "simd" ? isa_list.size() : 1); ++ii) {
        std::string name = k;
        if (k == "simd") {
          rtn_fast_force_isa(isa_list[ii]);
          name += std::string("/") + rtn_isa_name(rtn_fast_isa());
        }
        QuantResult out;
        double best = 1e30;
        for (int r = 0; r < (k == "ref" ? 1 : reps); ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          if (k == "simd") rtn_lsq_simd(w, spec, opt, out);
          else if (k == "panels") rtn_lsq_fast(w, spec, opt, out);
          else if (k == "ref") rtn_lsq_ref(w, spec, opt, out);
          else usage(argv[0]);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        const char* cmp = have_first ? (same(first, out) ? "same" : "DIFFERENT") : "-";
        if (!have_first) first = out, have_first = true;
        std::printf("%-13s  %-5s  %7s  %5lldx%-6lld %5lld  %-4s  %8.4f  %10.1f  %6.3f  %s\n", name.c_str(), dtype.c_str(),
                    ts.c_str(), (long long)rows, (long long)cols, (long long)block, zp ? "zp" : "sym", best,
                    double(n) / best / 1e6, bytes / best / 1e9, cmp);
        std::fflush(stdout);
      }
  }
  return 0;
}

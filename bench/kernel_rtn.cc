// Throughput of the CPU RTN kernels (rtn_quantize_fast, and optionally the reference) on one
// 7B-layer-shaped weight, in Mweights/s. Benchmarks measure; nothing here asserts.
//
//   build/bench_kernel_rtn [--rows 4096] [--cols 11008] [--block 128] [--threads 1,2]
//                          [--dtypes fp32,fp16,bf16] [--reps 3] [--zp] [--axis 0] [--ref]
//                          [--isa auto|generic|avx2|avx512|all] [--ort]
//
// Weights: N(0, 0.02) from a fixed seed, stored in the dtype. Each figure is the best of --reps
// runs (wall clock of rtn_quantize_fast alone; the output vectors are reused, so no page faults).
// --ort: ONNX Runtime's arithmetic (nibble mode's rtn_dq), else ModelOpt's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_ref.h"
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

DType parse_dtype(const std::string& s) {
  if (s == "fp32") return DType::kFloat32;
  if (s == "fp16") return DType::kFloat16;
  if (s == "bf16") return DType::kBFloat16;
  std::fprintf(stderr, "unknown dtype %s\n", s.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096, cols = 11008, block = 128;
  int reps = 3, axis = 0;
  bool zp = false, ref = false, ort = false;
  std::string threads = "1,2", dtypes = "fp32,fp16,bf16", isas = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rows") rows = std::stoll(next());
    else if (a == "--cols") cols = std::stoll(next());
    else if (a == "--block") block = std::stoll(next());
    else if (a == "--threads") threads = next();
    else if (a == "--dtypes") dtypes = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--axis") axis = std::stoi(next());
    else if (a == "--isa") isas = next();
    else if (a == "--zp") zp = true;
    else if (a == "--ref") ref = true;
    else if (a == "--ort") ort = true;
    else {
      std::fprintf(stderr, "usage: %s [--rows R] [--cols C] [--block B] [--threads 1,2] "
                           "[--dtypes fp32,fp16,bf16] [--reps N] [--axis 0|1] [--zp] [--ref] [--isa auto|generic|avx2|avx512|all] [--ort]\n", argv[0]);
      return 2;
    }
  }
  const size_t n = size_t(rows * cols);
  std::vector<float> f(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (auto& v : f) v = d(rng);
  std::vector<RtnIsa> isa_list;
  for (const auto& s : split(isas)) {
    if (s == "all") {
      for (RtnIsa i : rtn_fast_isas()) isa_list.push_back(i);
      continue;
    }
    bool found = false;
    for (RtnIsa i : {RtnIsa::kAuto, RtnIsa::kGeneric, RtnIsa::kAvx2, RtnIsa::kAvx512})
      if (s == rtn_isa_name(i)) {
        isa_list.push_back(i);
        found = true;
      }
    if (!found) {
      std::fprintf(stderr, "unknown isa %s\n", s.c_str());
      return 2;
    }
  }
  std::printf("kernel        dtype  threads  shape          block  mode  best_s    Mweights/s\n");
  for (const auto& ds : split(dtypes)) {
    const DType t = parse_dtype(ds);
    std::vector<uint16_t> h;
    if (t != DType::kFloat32) {
      h.resize(n);
      for (size_t i = 0; i < n; ++i) h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
    }
    WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), rows, cols, axis};
    QuantSpec spec{4, block, zp};
    if (ort) spec.rtn_arithmetic = RtnArithmetic::kOnnxRuntime;
    for (const auto& ts : split(threads)) {
      set_num_threads(std::stoi(ts));
      for (size_t ii = 0; ii < isa_list.size() + (ref ? 1 : 0); ++ii) {
        const int kernel = ii < isa_list.size() ? 0 : 1;
        std::string name = "ref";
        if (kernel == 0) {
          rtn_fast_force_isa(isa_list[ii]);
          name = std::string("fast/") + rtn_isa_name(rtn_fast_isa());
        }
        QuantResult out;
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          if (kernel == 0) rtn_quantize_fast(w, spec, out);
          else rtn_quantize_ref(w, spec, out);
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          best = std::min(best, s);
        }
        std::printf("%-12s  %-5s  %7s  %5lldx%-6lld  %5lld  %-4s  %8.4f  %10.1f\n", name.c_str(),
                    ds.c_str(), ts.c_str(), (long long)rows, (long long)cols, (long long)block, ort ? (zp ? "zp-ort" : "sym-ort") : zp ? "zp" : "sym",
                    best, double(n) / best / 1e6);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

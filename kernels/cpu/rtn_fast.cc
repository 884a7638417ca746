#include "kernels/cpu/rtn_fast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/half_float.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#endif

// One copy of the kernels per instruction set. The portable copy is plain C++ (SSE2 on x86-64);
// with GCC on x86 the same source is also compiled for AVX2 and for AVX-512 (`#pragma GCC
// target`: only the functions defined in between get the wider ISA, so no inline function shared
// with other translation units is ever emitted with instructions the CPU may lack), and
// rtn_quantize_fast picks one at run time (__builtin_cpu_supports). No FMA is enabled and the
// build has no -ffast-math: every copy computes the same bits (the unit tests run each copy
// against the reference).
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define NIBBLE_RTN_X86_CLONES 1
#endif

namespace nibble::kernels {
namespace generic {
namespace {
#include "kernels/cpu/rtn_fast_kernels.inc"
}  // namespace
}  // namespace generic

#ifdef NIBBLE_RTN_X86_CLONES
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#define NIBBLE_RTN_F16C 1  // load_row / round_row convert fp16 with F16C
namespace avx2 {
namespace {
#include "kernels/cpu/rtn_fast_kernels.inc"
}  // namespace
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl")
#define NIBBLE_RTN_F16C_512 1  // and sixteen lanes at a time where a loop is written for them
namespace avx512 {
namespace {
#include "kernels/cpu/rtn_fast_kernels.inc"
}  // namespace
}  // namespace avx512
#undef NIBBLE_RTN_F16C_512
#undef NIBBLE_RTN_F16C
#pragma GCC pop_options
#endif

namespace {

bool isa_supported(RtnIsa isa) {
  switch (isa) {
    case RtnIsa::kGeneric: return true;
#ifdef NIBBLE_RTN_X86_CLONES
    case RtnIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case RtnIsa::kAvx512:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    default: return false;
  }
}

RtnIsa best_isa() {
  for (RtnIsa isa : {RtnIsa::kAvx512, RtnIsa::kAvx2})
    if (isa_supported(isa)) return isa;
  return RtnIsa::kGeneric;
}

RtnIsa& forced_isa() {
  static RtnIsa isa = RtnIsa::kAuto;
  return isa;
}

RtnIsa active_isa() {
  const RtnIsa f = forced_isa();
  if (f != RtnIsa::kAuto) return f;
  static const RtnIsa best = best_isa();
  return best;
}

// `packed`: the kernel writes the codes in ONNX INT4 packing (out.packed) instead of a byte each (out.codes).
void prepare(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out, bool packed = false) {
  out.groups = num_blocks(w.K(), spec.block);
  // Every code is written by the kernels, so a reused vector keeps its bytes until then (no memset of a
  // 7B weight's 45 MB of codes; only a grown tail is zeroed).
  if (packed) {
    if (out.packed.capacity() < out.codes.capacity()) out.packed.swap(out.codes);  // the caller's reused pages
    out.packed.resize(size_t(w.rows * w.cols) / 2);
    out.codes.clear();
  } else {
    out.codes.resize(size_t(w.rows * w.cols));
    out.packed.clear();
  }
  out.scales.assign(size_t(out.groups * w.N()), 0.0f);
  out.zero_points.assign(spec.zero_point ? out.scales.size() : 0, 0);
}

}  // namespace

std::vector<RtnIsa> rtn_fast_isas() {
  std::vector<RtnIsa> out;
  for (RtnIsa isa : {RtnIsa::kGeneric, RtnIsa::kAvx2, RtnIsa::kAvx512})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

const char* rtn_isa_name(RtnIsa isa) {
  switch (isa) {
    case RtnIsa::kAuto: return "auto";
    case RtnIsa::kGeneric: return "generic";
    case RtnIsa::kAvx2: return "avx2";
    case RtnIsa::kAvx512: return "avx512";
  }
  return "?";
}

void rtn_fast_force_isa(RtnIsa isa) {
  if (isa != RtnIsa::kAuto && !isa_supported(isa))
    throw std::invalid_argument(std::string("rtn: this CPU cannot run the ") + rtn_isa_name(isa) + " kernels");
  forced_isa() = isa;
}

RtnIsa rtn_fast_isa() { return active_isa(); }

void rtn_quantize_weighted_fast(const WeightMatrix& w, const QuantSpec& spec, const float* weight,
                                const std::vector<float>& ratios, QuantResult& out) {
  if (ratios.empty()) throw std::invalid_argument("rtn_quantize_weighted: no clip ratio to try");
  if (w.k_axis != 0) {
    rtn_quantize_weighted(w, spec, weight, ratios, out);  // [N, K] layouts: the reference
    return;
  }
  prepare(w, spec, out);
  switch (active_isa()) {
#ifdef NIBBLE_RTN_X86_CLONES
    case RtnIsa::kAvx512: avx512::weighted_entry(w, spec, weight, ratios, out); break;
    case RtnIsa::kAvx2: avx2::weighted_entry(w, spec, weight, ratios, out); break;
#endif
    default: generic::weighted_entry(w, spec, weight, ratios, out); break;
  }
}

void rtn_quantize_fast(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
  // QuantResult::pack: the [K, N] kernel packs each row's codes where the row is whole bytes (N even);
  // the other layouts pack after.
  const bool pack = out.pack && spec.bits == 4;
  const bool in_kernel = pack && w.k_axis == 0 && w.cols % 2 == 0;
  prepare(w, spec, out, in_kernel);
  switch (active_isa()) {
#ifdef NIBBLE_RTN_X86_CLONES
    case RtnIsa::kAvx512: avx512::rtn_entry(w, spec, out); break;
    case RtnIsa::kAvx2: avx2::rtn_entry(w, spec, out); break;
#endif
    default: generic::rtn_entry(w, spec, out); break;
  }
  if (pack && !in_kernel) {
    out.packed = pack_onnx(out.codes, 4);
    out.codes.clear();
  }
}

}  // namespace nibble::kernels

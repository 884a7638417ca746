#include "kernels/cpu/rtn_lsq_fast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/cpu/block_fit.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/half_float.h"
#include "kernels/parallel.h"

// The ISA copies as in rtn_fast.cc: portable C++, and with GCC on x86 the same source built for AVX2
// and AVX-512 (no FMA: -ffp-contract=off), picked by rtn_fast_isa().
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define NIBBLE_LSQ_X86_CLONES 1
#endif

namespace nibble::kernels {
namespace {

// NIBBLE_LSQ_LANES: channels per vector in each copy (a float vector as wide as the ISA's registers).
namespace generic {
#define NIBBLE_LSQ_LANES 4
#include "kernels/cpu/rtn_lsq_fast_kernels.inc"
}  // namespace generic

#ifdef NIBBLE_LSQ_X86_CLONES
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
namespace avx2 {
#define NIBBLE_LSQ_LANES 8
#include "kernels/cpu/rtn_lsq_fast_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl")
namespace avx512 {
#define NIBBLE_LSQ_LANES 16
#include "kernels/cpu/rtn_lsq_fast_kernels.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif

}  // namespace

void rtn_lsq_simd(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  fit::size_params<BlockParams>(out, G * N, spec.zero_point);
  std::vector<double> err(size_t(G * N), 0.0);  // per block, [g][n]
  switch (rtn_fast_isa()) {
#ifdef NIBBLE_LSQ_X86_CLONES
    case RtnIsa::kAvx512: avx512::lsq_entry(w, spec, opt, out, err.data()); break;
    case RtnIsa::kAvx2: avx2::lsq_entry(w, spec, opt, out, err.data()); break;
#endif
    default: generic::lsq_entry(w, spec, opt, out, err.data()); break;
  }
  // Each column over its blocks, the columns in order: the reference's sum.
  out.sq_error = 0;
  for (int64_t n = 0; n < N; ++n) {
    double column = 0;
    for (int64_t g = 0; g < G; ++g) column += err[size_t(g * N + n)];
    out.sq_error += column;
  }
}

}  // namespace nibble::kernels

#include "kernels/cpu/rtn_lsq_fast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

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
// Vector arguments of always-inlined helpers only; no vector crosses a call between ISA copies.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace nibble::kernels {
namespace {

// kV lanes: one vector of floats, its doubles, masks and the codes of one element of kV channels.
constexpr int kV = 16;
typedef float vf __attribute__((vector_size(kV * 4)));
typedef double vd __attribute__((vector_size(kV * 8)));
typedef int32_t vi __attribute__((vector_size(kV * 4)));
typedef uint32_t vu __attribute__((vector_size(kV * 4)));
typedef int64_t vl __attribute__((vector_size(kV * 8)));
typedef uint16_t vh __attribute__((vector_size(kV * 2)));
typedef uint8_t vb __attribute__((vector_size(kV)));

namespace generic {
#include "kernels/cpu/rtn_lsq_fast_kernels.inc"
}  // namespace generic

#ifdef NIBBLE_LSQ_X86_CLONES
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
namespace avx2 {
#include "kernels/cpu/rtn_lsq_fast_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl")
namespace avx512 {
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

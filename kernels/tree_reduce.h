// The fixed order of nibble's parallel reductions, as plain functions every backend calls: where the
// GPU reduces lanes in parallel, this order is part of the operation's definition, and the CPU
// backend, the emulated device and the CUDA kernels all follow it, so they make the same choices.
#pragma once
#include <cstdint>

#include "kernels/half_float.h"  // NIBBLE_HD

namespace nibble::kernels {

// The pairwise tree over N = 2^m values: level s = N/2, N/4, ..., 1 sets v[i] = op(v[i], v[i + s]) for
// i < s; the result is v[0]. A warp's __shfl_down_sync reduction (offsets 16, 8, ..., 1) and a halving
// reduction in shared memory add in exactly this order. v is overwritten.
template <int N, class T, class Op>
NIBBLE_HD inline T tree_reduce(T* v, Op op) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "the tree needs a power of two");
  for (int s = N / 2; s > 0; s /= 2)
    for (int i = 0; i < s; ++i) v[i] = op(v[i], v[i + s]);
  return v[0];
}

struct PlusOp {
  template <class T>
  NIBBLE_HD T operator()(T a, T b) const { return a + b; }
};

// Σ_k a(k)·b(k) over one column of K values (a(k) at a[k * ld]), the AWQ loss's column sum as every
// backend computes it: kColumnSlices slice sums, slice s the float64 sum of the exact products
// double(a)·double(b) over k ≡ s (mod kColumnSlices), k ascending from 0.0, then tree_reduce over the
// slices. On the GPU a slice is one warp (its lanes are adjacent columns, adjacent addresses), so the
// slice count is the warps per block (kernels/cuda/column_dot_kernels.h).
//
// float64: the product of two floats is exact in double and the sums nearly so. The loss gaps that
// pick an alpha can be tiny (SmolLM2-135M fp32, awq_lite: the best two of 11 candidates 3.1e-6 apart
// relative on one of 150 weights), near the float32 products' own rounding, and these K multiply-adds
// per column cost little beside the K² N product that feeds them: even at an RTX card's 1/64-rate
// fp64 they keep up with its memory (bench/GPU-MODEL.md, launch shapes).
constexpr int kColumnSlices = 16;

inline double column_dot_ref(const float* a, const float* b, int64_t K, int64_t ld) {
  double slice[kColumnSlices] = {};
  for (int64_t k = 0; k < K; ++k)
    slice[k % kColumnSlices] += double(a[k * ld]) * double(b[k * ld]);
  return tree_reduce<kColumnSlices>(slice, PlusOp{});
}

}  // namespace nibble::kernels

// The AWQ loss's column sums as a cooperative kernel (launch_blocks.h): Σ_k a(k, n)·b(k, n) for every
// column n of two row-major [rows, width] arrays, in column_dot_ref's order (kernels/tree_reduce.h).
//
// Shape: the BLAS product's output Y is column-major width x K, i.e. row-major [K, width]: a column's
// values are `width` floats apart and a row's are adjacent. So a warp's 32 lanes take 32 adjacent
// columns (each load of a warp reads 32 adjacent floats of one row: 128 bytes, coalesced) and the
// block's kColumnSlices warps take the slices of K (warp s: rows k ≡ s mod 16). A block is 32 columns
// x 16 warps = 512 threads; for N = 4096, 128 blocks of 16 warps, each thread K/16 rows.
// Phase 0: each thread's slice sum, to shared memory; phase 1: warp 0, one thread per column, adds
// the 16 slice sums by the tree.
#pragma once
#include "kernels/cuda/launch_blocks.h"
#include "kernels/tree_reduce.h"

namespace nibble::kernels::gpu {

struct ColumnDotBlocks {
  static constexpr int kLanes = kWarp * kColumnSlices;
  static constexpr int kPhases = 2;
  struct Shared {
    double slice[kColumnSlices][kWarp];
  };
  const float* a;
  const float* b;
  int64_t rows, width;
  // Row panels of a longer K: row 0 here is row k0 of the column, and the slice sums carry over in
  // `partial` ([kColumnSlices, width]) from the panel with `first` to the one with `last`.
  int64_t k0;
  double* partial;  // null when one launch covers all K
  bool first, last;
  double* out;  // [width], written by the last panel

  template <int P>
  NIBBLE_HD void phase(int64_t block, int lane, Shared& sh) const {
    const int c = lane % kWarp, s = lane / kWarp;
    const int64_t n = block * kWarp + c;
    if (n >= width) return;
    if constexpr (P == 0) {
      double acc = first ? 0.0 : partial[s * width + n];
      const int64_t j0 = (s - k0 % kColumnSlices + kColumnSlices) % kColumnSlices;  // first row of slice s
      for (int64_t j = j0; j < rows; j += kColumnSlices) acc += double(a[j * width + n]) * double(b[j * width + n]);
      sh.slice[s][c] = acc;
      if (!last) partial[s * width + n] = acc;
    } else {
      if (!last || s != 0) return;
      double v[kColumnSlices];
      for (int i = 0; i < kColumnSlices; ++i) v[i] = sh.slice[i][c];
      out[n] = tree_reduce<kColumnSlices>(v, PlusOp{});
    }
  }
};

inline int64_t column_dot_blocks(int64_t width) { return (width + kWarp - 1) / kWarp; }

}  // namespace nibble::kernels::gpu

// Kernel bodies of the activation statistics (backend_statistics.cu): Σ|x| one thread per channel in row
// order, the float64 fold of a float32 product one thread per element, the packed triangle unfolded, the
// float32 rounding and the finiteness flags. Each computes the CPU backend's values bit for bit (the adds
// are the same adds, in the same order per element).
#pragma once
#include <cstdint>

#include "kernels/cuda/hd_float.h"

namespace nibble::kernels::gpu {

// Row i's first kept element in a packed upper triangle of order K (kernels::packed_row).
NIBBLE_HD inline int64_t packed_offset(int64_t i, int64_t K) { return i * (2 * K - i + 1) / 2; }

// sum[k] += |x(r, k)| for r = 0..n-1 in order: x [n, K] row-major.
struct SumAbsBody {
  const float* x;
  int64_t n, K;
  double* sum;
  NIBBLE_HD void operator()(int64_t k) const {
    double a = sum[k];
    for (int64_t r = 0; r < n; ++r) a += double(hd::fabs(x[r * K + k]));
    sum[k] = a;
  }
};

// A column panel's product g [j0 + w, w] (row-major; row i, column j - j0) added into the packed upper
// triangle: the elements with j >= i.
struct FoldPanelBody {
  const float* g;
  int64_t j0, w, K;
  double* packed;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t i = idx / w, j = j0 + idx % w;
    if (j >= i) packed[packed_offset(i, K) - i + j] += double(g[idx]);
  }
};

// A diagonal block's product g [w, w] (upper triangle written) added into block dst [B, B], both triangles.
struct FoldBlockBody {
  const float* g;
  int64_t w, B;
  double* dst;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t i = idx / w, j = idx % w;
    if (j < i) return;
    const double v = double(g[idx]);
    dst[i * B + j] += v;
    if (j > i) dst[j * B + i] += v;
  }
};

// The whole K x K from the packed upper triangle.
struct UnpackGramBody {
  const double* packed;
  int64_t K;
  double* out;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t i = idx / K, j = idx % K, a = i < j ? i : j, b = i < j ? j : i;
    out[idx] = packed[packed_offset(a, K) - a + b];
  }
};

struct NarrowBody {
  const double* in;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const { out[i] = float(in[i]); }
};

// flag[c] = 1 where values [c·chunk, (c + 1)·chunk) are all finite (v - v is 0 only for a finite v).
struct FiniteChunkBody {
  const double* v;
  int64_t n, chunk;
  uint8_t* flag;
  NIBBLE_HD void operator()(int64_t c) const {
    const int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    uint8_t ok = 1;
    for (int64_t i = c * chunk; i < end; ++i) ok &= uint8_t(v[i] - v[i] == 0.0);
    flag[c] = ok;
  }
};

}  // namespace nibble::kernels::gpu

// Kernel bodies of weight scaling, the AWQ statistics and the AWQ loss: element-wise bodies one
// thread per element, reductions one thread per output with the reference's summation order.
#pragma once
#include "kernels/cuda/hd_float.h"
#include "kernels/cuda/rtn_kernels.h"

namespace nibble::kernels::gpu {

// numpy's float32 add.reduce (pairwise, blocks of 8 below 128) of f(0..n-1): awq_ref.cc's numpy_sum_f32
// over a generated row, so a reduction needs no scratch row.
template <class F>
NIBBLE_HD float numpy_sum(const F& f, int64_t off, int64_t n) {
  if (n < 8) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; ++i) r += f(off + i);
    return r;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = f(off + j);
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += f(off + i + j);
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += f(off + i);
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_sum(f, off, n2) + numpy_sum(f, off + n2, n - n2);
}

// W ⊙ s along K (stored layout), rounded to the weight dtype (out_dtype = w dtype) or kept in fp32.
struct ScaleBody {
  const void* w;
  int dtype, out_dtype;
  int64_t cols;
  int k_axis;
  const float* s;
  void* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const float sk = s[k_axis == 0 ? i / cols : i % cols];
    hd::store(out_dtype, out, i, hd::round_to(out_dtype, hd::load(dtype, w, i) * sk));
  }
};

// W ⊘ d along N: w / round(d[n]), rounded to the weight dtype.
struct DivideColumnsBody {
  const void* w;
  int dtype;
  int64_t cols;
  int k_axis;
  const float* d;
  void* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const float dn = d[k_axis == 0 ? i % cols : i / cols];
    hd::store(dtype, out, i, hd::round_to(dtype, hd::load(dtype, w, i) / hd::round_to(dtype, dn)));
  }
};

// amax of each group of get_weight_scale: contiguous (group g * N + n, block rows) or ModelOpt's
// strided view (group m gathers flat indices m, m + M, ... of the logical [K, N] array).
struct GroupAmaxBody {
  WeightView w;
  int64_t block, M;
  bool contiguous;
  float* amax;
  NIBBLE_HD void operator()(int64_t m) const {
    const int64_t K = w.K(), N = w.N();
    float a = 0.0f;
    if (contiguous) {
      const int64_t g = m / N, n = m % N, k1 = (g + 1) * block < K ? (g + 1) * block : K;
      for (int64_t k = g * block; k < k1; ++k) a = hd::max(a, hd::fabs(w.at(k, n)));
    } else {
      for (int64_t f = m; f < K * N; f += M) a = hd::max(a, hd::fabs(w.at(f / N, f % N)));
    }
    amax[m] = a;
  }
};

// mean over n of |w(k, n)| / (amax of its group + FLT_MIN), one thread per k (weight_mean).
struct WeightMeanBody {
  WeightView w;
  int64_t block, M;
  bool contiguous;
  const float* amax;
  float* out;
  struct Row {
    const WeightMeanBody* b;
    int64_t k;
    NIBBLE_HD float operator()(int64_t n) const {
      const int64_t N = b->w.N();
      const int64_t grp = b->contiguous ? (k / b->block) * N + n : (k * N + n) % b->M;
      return hd::fabs(b->w.at(k, n)) / (b->amax[grp] + 1.17549435e-38f);
    }
  };
  NIBBLE_HD void operator()(int64_t k) const { out[k] = numpy_sum(Row{this, k}, 0, w.N()) / float(w.N()); }
};

// Element-wise mean of m vectors of length K stored [m, K], numpy's float32 order (mean_of).
struct MeanOfBody {
  const float* v;
  int64_t m, K;
  float* out;
  struct Col {
    const MeanOfBody* b;
    int64_t k;
    NIBBLE_HD float operator()(int64_t j) const { return b->v[j * b->K + k]; }
  };
  NIBBLE_HD void operator()(int64_t k) const { out[k] = numpy_sum(Col{this, k}, 0, m) / float(m); }
};

// diag[k] / s[k]² (channel_energy: float64 diagonal; AWQ loss: the float32 Gram diagonal).
struct EnergyF64Body {
  const double* diag;
  const float* s;
  float* out;
  NIBBLE_HD void operator()(int64_t k) const {
    out[k] = s ? float(diag[k] / (double(s[k]) * double(s[k]))) : float(diag[k]);
  }
};
struct EnergyF32Body {
  const float* diag;
  const float* s;
  float* out;
  NIBBLE_HD void operator()(int64_t k) const { out[k] = diag[k] / (s[k] * s[k]); }
};

// D = W - Ŵ / s in the logical layout [K, N] row-major (the column-major Dᵀ the BLAS calls read):
// w is the original weight, q the quantization of W ⊙ s (stored in dtype qdt).
struct AwqDiffBody {
  WeightView w;
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zero_points;
  int64_t block;
  int qdt;
  const float* s;
  float* d;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + block - 1) / block, k = i / N, n = i % N;
    const int64_t pi = w.param(G, k / block, n), ci = w.index(k, n);
    const int code = zero_points ? int(codes[ci]) - int(zero_points[pi]) : int(int8_t(codes[ci]));
    const float deq = hd::round_to(qdt, float(code) * scales[pi]);
    d[i] = w.at(k, n) - deq / s[k];
  }
};

// acc[n] += Σ_{k < rows} a[k * N + n] * b[k * N + n] in double, k ascending: each column's sum runs in
// one fixed order whatever the panels it is computed in.
struct ColumnDotBody {
  const float* a;
  const float* b;
  int64_t rows, N;
  double* acc;
  NIBBLE_HD void operator()(int64_t n) const {
    double s = acc[n];
    for (int64_t k = 0; k < rows; ++k) s += double(a[k * N + n]) * double(b[k * N + n]);
    acc[n] = s;
  }
};

// Cholesky helpers: add `shift` to the diagonal; U (row-major upper, float) from the column-major
// lower factor of the same array (its transpose), the strict lower triangle zero.
struct ShiftDiagonalBody {
  double* a;
  int64_t K;
  double shift;
  NIBBLE_HD void operator()(int64_t k) const { a[k * K + k] += shift; }
};
struct UpperFloatBody {
  const double* a;
  int64_t K;
  float* u;
  NIBBLE_HD void operator()(int64_t i) const { u[i] = (i % K) >= (i / K) ? float(a[i]) : 0.0f; }
};

// The scaled diagonal blocks of a float64 Gram matrix for the clip search, rounded to float as the
// reference feeds them: g[(b * B + i) * B + j] = float(G_bb(i, j) * (inv_s_i * inv_s_j)).
struct GramBlocksBody {
  const double* src;  // [G, B, B] (the block-diagonal, zero-padded)
  const float* inv_s;
  int64_t B, K;
  float* dst;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t j = idx % B, i = (idx / B) % B, k0 = (idx / (B * B)) * B;
    double v = src[idx];
    if (inv_s && k0 + i < K && k0 + j < K) v *= double(inv_s[k0 + i]) * double(inv_s[k0 + j]);
    dst[idx] = float(v);
  }
};

}  // namespace nibble::kernels::gpu

// Kernel bodies of weight scaling, the AWQ statistics and the AWQ loss: element-wise bodies one
// thread per element, reductions one thread per output with the reference's summation order (the
// loss's column sums are cooperative: column_dot_kernels.h).
#pragma once
#include "kernels/cuda/hd_float.h"
#include "kernels/cuda/rtn_kernels.h"

namespace nibble::kernels::gpu {

// numpy's float32 add.reduce of a run of at most 128: eight running sums, then the rest in order.
template <class F>
NIBBLE_HD float numpy_leaf(const F& f, int64_t off, int64_t n) {
  if (n < 8) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; ++i) r += f(off + i);
    return r;
  }
  float r0 = f(off), r1 = f(off + 1), r2 = f(off + 2), r3 = f(off + 3), r4 = f(off + 4), r5 = f(off + 5),
        r6 = f(off + 6), r7 = f(off + 7);
  int64_t i = 8;
  for (; i < n - (n % 8); i += 8) {
    r0 += f(off + i), r1 += f(off + i + 1), r2 += f(off + i + 2), r3 += f(off + i + 3);
    r4 += f(off + i + 4), r5 += f(off + i + 5), r6 += f(off + i + 6), r7 += f(off + i + 7);
  }
  float res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7));
  for (; i < n; ++i) res += f(off + i);
  return res;
}

// numpy's float32 add.reduce (pairwise, blocks of 8 below 128) of f(0..n-1): awq_ref.cc's numpy_sum_f32
// over a generated row, so a reduction needs no scratch row. numpy recurses on (n2, n - n2), n2 =
// n/2 rounded down to a multiple of 8; here the same tree is walked with an explicit stack (recursion
// on a GPU saves registers around every call: spills), so the sums are added in the same order. One
// call site of numpy_leaf (a run of at most 128 is a tree of one leaf): inlined once, fewer registers.
template <class F>
NIBBLE_HD float numpy_sum(const F& f, int64_t off, int64_t n) {
  // 32-bit offsets: a reduction runs along one row or column (n < 2^31); depth 40 covers n < 2^46.
  int32_t offs[40], lens[40];
  float lefts[40];
  bool right[40];  // false: the left child is being summed, true: the right one
  int d = 0;
  offs[0] = int32_t(off), lens[0] = int32_t(n), right[0] = false;
  for (;;) {
    while (lens[d] > 128) {  // descend to the leftmost leaf of this subtree
      int32_t n2 = lens[d] / 2;
      n2 -= n2 % 8;
      offs[d + 1] = offs[d], lens[d + 1] = n2, right[d + 1] = false;
      ++d;
    }
    float sum = numpy_leaf(f, offs[d], lens[d]);
    for (;;) {  // return the sum up: a left child hands over to its right sibling
      --d;
      if (d < 0) return sum;
      if (!right[d]) {
        lefts[d] = sum;
        right[d] = true;
        int32_t n2 = lens[d] / 2;
        n2 -= n2 % 8;
        offs[d + 1] = offs[d] + n2, lens[d + 1] = lens[d] - n2, right[d + 1] = false;
        ++d;
        break;
      }
      sum = lefts[d] + sum;
    }
  }
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

// mean over n of |w(k, n)| / (amax of its group + damp), one thread per k: weight_mean (damp FLT_MIN)
// and, on the siblings side by side, weight_mean_joint (damp 1e-6f).
struct WeightMeanBody {
  WeightView w;
  int64_t block, M;
  bool contiguous;
  const float* amax;
  float* out;
  float damp = 1.17549435e-38f;
  // The group of (k, n) is base + n, base the group of (k, 0): contiguous (k / block) * N; strided
  // (k * N) % M, wrapped (once when N <= M, as in weight_mean) — no 64-bit division per element (a call
  // on the GPU: spills).
  struct Row {
    const WeightMeanBody* b;
    int64_t k, base;
    NIBBLE_HD float operator()(int64_t n) const {
      int64_t grp = base + n;
      if (!b->contiguous)
        while (grp >= b->M) grp -= b->M;
      return hd::fabs(b->w.at(k, n)) / (b->amax[grp] + b->damp);
    }
  };
  NIBBLE_HD void operator()(int64_t k) const {
    const int64_t N = w.N(), base = contiguous ? (k / block) * N : (k * N) % M;
    out[k] = numpy_sum(Row{this, k, base}, 0, N) / float(N);
  }
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

// out[r] = Σ_n a[r * N + n], n ascending (one row per index): the host's order for the same sum.
struct RowSumBody {
  const double* a;
  int64_t N;
  double* out;
  NIBBLE_HD void operator()(int64_t r) const {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += a[r * N + n];
    out[r] = s;
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
// The largest diagonal element of a K x K matrix, by one thread in order (K values: the Cholesky shifts'
// scale, as the host computes it; a NaN is skipped as std::max skips it).
struct MaxDiagonalBody {
  const double* a;
  int64_t K;
  double* out;
  NIBBLE_HD void operator()(int64_t) const {
    double m = 0;
    for (int64_t k = 0; k < K; ++k) m = m < a[k * K + k] ? a[k * K + k] : m;
    *out = m;
  }
};
// Float32 values widened to float64 (exact): a float64 array that went up at half its bytes.
struct WidenBody {
  const float* in;
  double* out;
  NIBBLE_HD void operator()(int64_t i) const { out[i] = double(in[i]); }
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

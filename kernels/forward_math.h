// The layer engine's scalar arithmetic, callable from host and device (NIBBLE_HD): the bodies of the
// forward_* operations on every backend (the reference in kernels/cpu/forward_ref.cc, the CUDA backend's
// kernels). Each mirrors the host engine's operator (forward/) operation for operation: no product is
// fused into an add unless written so (fmaf: the logistic function's, as ONNX Runtime's), -ffp-contract=off
// and nvcc --fmad=false, so +, −, ×, ÷, fmaf and sqrt give the host's bits on a GPU too; tanh, erf and pow are the device's own there (within their ulp bounds), libm's on the host.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/forward_types.h"
#include "kernels/hd_float.h"

namespace nibble::kernels::fw {

NIBBLE_HD inline float fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

NIBBLE_HD inline float sqrt(float x) {
#ifdef __CUDA_ARCH__
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
NIBBLE_HD inline float tanh(float x) {
#ifdef __CUDA_ARCH__
  return tanhf(x);
#else
  return std::tanh(x);
#endif
}
NIBBLE_HD inline float erf(float x) {
#ifdef __CUDA_ARCH__
  return erff(x);
#else
  return std::erf(x);
#endif
}
NIBBLE_HD inline float pow(float a, float b) {
#ifdef __CUDA_ARCH__
  return powf(a, b);
#else
  return std::pow(a, b);
#endif
}

// exp as forward/fast_exp.h's four-lane exp_fast computes each lane (Cephes' expf: a degree-5 polynomial on
// x − n·ln 2, scaled by 2^n through the exponent bits; clamped to [-87.3, 88.3]; NaN stays NaN).
NIBBLE_HD inline float exp_fast(float x) {
  float c = x > -87.3f ? x : -87.3f;
  c = c < 88.3f ? c : 88.3f;
  const float magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  const float n = (c * 1.44269504088896341f + magic) - magic;
  float r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = hd::bits_f32(uint32_t((int32_t(n) + 127) << 23));
  return x != x ? x : y * scale;
}

// The logistic function as ONNX Runtime's CPU kernels compute it (MLAS, the x86 FMA kernel behind Sigmoid and
// the fused QuickGelu/SiLU): an odd rational function p(x)/q(x) + 1/2 of x clamped to [-18, 18], each
// polynomial by Horner's rule in fused multiply-adds, the result clamped to [0, 1]. Within 2e-7 (absolute)
// of the logistic function, and ONNX Runtime's bits where it runs that kernel (tests/e2e/test_engine_bits.py),
// so that an fp16 model's activations round where ONNX Runtime's do. NaN stays NaN.
NIBBLE_HD inline float sigmoid(float x) {
  float v = x < -18.0f ? -18.0f : x;
  v = v > 18.0f ? 18.0f : v;
  const float v2 = v * v;
  float p = fma(v2, 4.37031012579801e-11f, 1.15627324459942e-07f);
  p = fma(p, v2, 6.08574864600143e-05f);
  p = fma(p, v2, 8.51377133304701e-03f);
  p = fma(p, v2, 2.48287947061529e-01f);
  p = p * v;
  float q = fma(v2, 6.10247389755681e-13f, 5.76102136993427e-09f);
  q = fma(q, v2, 6.29106785017040e-06f);
  q = fma(q, v2, 1.70198817374094e-03f);
  q = fma(q, v2, 1.16817656904453e-01f);
  q = fma(q, v2, 9.93151921023180e-01f);
  const float r = p / q + 0.5f;
  return r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r);
}

// p · 2^e for an integral e ≤ 0 with one rounding (AVX-512's vscalefps): through the exponent bits, and
// below 2^-126 (a subnormal result) as (p · 2^(e+64)) · 2^-64, whose first product is exact.
NIBBLE_HD inline float scale_pow2(float p, float e) {
  if (e != e) return e;
  const int32_t k = int32_t(e);
  if (k >= -126) return p * hd::bits_f32(uint32_t(k + 127) << 23);
  return (p * hd::bits_f32(uint32_t(k + 64 + 127) << 23)) * hd::bits_f32(uint32_t(-64 + 127) << 23);
}

// exp(x) for a softmax's x − max ≤ 0 as ONNX Runtime's softmax computes it (MLAS's AVX-512 sum-of-exp
// kernel): x clamped below at −103.97, reduced by m = round(x / ln 2) in two fused steps, a degree-6
// polynomial in fused multiply-adds, scaled by 2^m. NaN stays NaN.
NIBBLE_HD inline float softmax_exp(float x) {
  x = x < -103.9720840454f ? -103.9720840454f : x;
  const float biased = fma(x, 1.44269504088896341f, 12582912.0f);  // + 1.5 · 2^23 rounds to an integer
  const float m = biased - 12582912.0f;
  x = fma(m, -6.93145752e-1f, x);
  x = fma(m, -1.42860677e-6f, x);
  float p = 0x1.694000p-10f;
  p = fma(p, x, 0x1.125edcp-7f);
  p = fma(p, x, 0x1.555b5ap-5f);
  p = fma(p, x, 0x1.555450p-3f);
  p = fma(p, x, 0x1.fffff6p-2f);
  p = fma(p, x, 1.0f);
  p = fma(p, x, 1.0f);
  return scale_pow2(p, m);
}

// Σ e[0..n) as that kernel sums it: sixteen lanes (element j into lane j mod 16, in order), the upper eight
// lanes added to the lower eight, then pairs, pairs of pairs and the two halves.
NIBBLE_HD inline float softmax_sum(const float* e, int64_t n) {
  float lane[16] = {};
  for (int64_t j = 0; j < n; ++j) lane[j % 16] += e[j];
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = lane[i + 8] + lane[i];
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Softmax of row[0..n) in place as ONNX Runtime's CPU kernels compute it (MlasComputeSoftmax): the maximum,
// softmax_exp of each x − max, softmax_sum, each element times 1 / sum.
NIBBLE_HD inline void softmax_mlas(float* row, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = m < row[j] ? row[j] : m;
  for (int64_t j = 0; j < n; ++j) row[j] = softmax_exp(row[j] - m);
  const float scale = 1.0f / softmax_sum(row, n);
  for (int64_t j = 0; j < n; ++j) row[j] *= scale;
}

NIBBLE_HD inline float binary(ForwardBinary op, float a, float b) {
  switch (op) {
    case ForwardBinary::kAdd: return a + b;
    case ForwardBinary::kSub: return a - b;
    case ForwardBinary::kMul: return a * b;
    case ForwardBinary::kDiv: return a / b;
    case ForwardBinary::kPow: return b == 2.0f ? a * a : pow(a, b);
  }
  return 0.0f;
}

NIBBLE_HD inline float unary(ForwardUnary op, float x) {
  switch (op) {
    case ForwardUnary::kSigmoid: return sigmoid(x);
    case ForwardUnary::kExp: return exp_fast(x - 0.0f);
    case ForwardUnary::kSqrt: return sqrt(x);
    case ForwardUnary::kReciprocal: return 1.0f / x;
    case ForwardUnary::kNeg: return -x;
    case ForwardUnary::kTanh: return tanh(x);
    case ForwardUnary::kErf: return erf(x);
    case ForwardUnary::kRelu: return x > 0.0f ? x : 0.0f;
    case ForwardUnary::kGeluErf: return 0.5f * x * (1.0f + erf(x * 0.70710678118654752440f));
    case ForwardUnary::kGeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2 / pi)
      return 0.5f * x * (1.0f + tanh(k * (x + 0.044715f * x * x * x)));
    }
  }
  return 0.0f;
}

// One row of forward_norm: a = x (+ skip) (+ bias) into `sum` (when given) and, unrounded, into y; then
// y = (a − mean) / dev · gamma (+ beta), the mean and the mean square summed in float in element order and
// dev = sqrt(mean square (− mean²) + eps): ONNX Runtime's CPU kernels' arithmetic, step for step, so that
// the norm gives their bits (an fp16 model's rounding then lands where theirs does). Null pointers for
// absent parts.
NIBBLE_HD inline void norm_row(const float* x, const float* skip, const float* bias, const float* gamma,
                               const float* beta, int64_t width, float eps, bool rms, int round, float* y,
                               float* sum, bool l2 = false) {
  if (l2) {  // forward/ops_norm.cc's LpNormalization: the norm in float64, rounded once
    double s = 0.0;
    for (int64_t j = 0; j < width; ++j) s += double(x[j]) * x[j];
#ifdef __CUDA_ARCH__
    const float norm = float(::sqrt(s));
#else
    const float norm = float(std::sqrt(s));
#endif
    for (int64_t j = 0; j < width; ++j) y[j] = hd::round_to(round, norm > 0.0f ? x[j] / norm : 0.0f);
    return;
  }
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t j = 0; j < width; ++j) {
    float a = x[j];
    if (skip) a += skip[j];
    if (bias) a += bias[j];
    y[j] = a;
    if (sum) sum[j] = hd::round_to(round, a);
    s1 += a;
    s2 += a * a;
  }
  const float n = float(width), mean = rms ? 0.0f : s1 / n;
  const float dev = sqrt(rms ? s2 / n + eps : s2 / n - mean * mean + eps);
  for (int64_t j = 0; j < width; ++j) {
    float r = (rms ? y[j] : y[j] - mean) / dev * gamma[j];
    if (beta) r += beta[j];
    y[j] = hd::round_to(round, r);
  }
}

// x (one head, its first 2·rot_half elements) rotated in place for position `pos` (ONNX Runtime's rotary:
// halves, or interleaved pairs), each output one fused multiply-add on a rounded product, as MLAS's AVX2
// rotary kernel computes it: x_a·cos − (x_b·sin) and x_a·sin + (x_b·cos).
NIBBLE_HD inline void rotate(float* x, const float* cos, const float* sin, int64_t rot_half, bool interleaved,
                             int64_t pos) {
  const float* cs = cos + pos * rot_half;
  const float* sn = sin + pos * rot_half;
  for (int64_t i = 0; i < rot_half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + rot_half;
    const float xa = x[a], xb = x[b];
    x[a] = fma(xa, cs[i], -(xb * sn[i]));
    x[b] = fma(xa, sn[i], xb * cs[i]);
  }
}

// Row s of one head's scores (S of them), in place: scaled (and capped) over the keys it sees, softmaxed
// as softmax_mlas does (GroupQueryAttention's CPU kernel calls MlasComputeSoftmax), zero elsewhere.
NIBBLE_HD inline void softmax_row(float* row, int64_t S, int64_t s, int64_t keys, float scale, float softcap,
                                  int64_t window) {
  const int64_t end = s + 1 < keys ? s + 1 : keys;
  const int64_t begin = window > 0 && end > window ? end - window : 0;
  float m = -INFINITY;
  for (int64_t j = begin; j < end; ++j) {
    float d = row[j] * scale;
    if (softcap > 0.0f) d = softcap * tanh(d / softcap);
    row[j] = d;
    m = m < d ? d : m;
  }
  for (int64_t j = begin; j < end; ++j) row[j] = softmax_exp(row[j] - m);
  const float inv = 1.0f / softmax_sum(row + begin, end - begin);
  for (int64_t j = 0; j < S; ++j) row[j] = j >= begin && j < end ? row[j] * inv : 0.0f;
}

// C[M, N] = A[M, K] · B ([K, N], or [N, K] when b_transposed), each output a float32 sum in k order: the
// definition of every forward product.
inline void matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += A[m * K + k] * (b_transposed ? B[n * K + k] : B[k * N + n]);
      C[m * N + n] = s;
    }
}

// The element of x that output element i of a strided copy reads.
NIBBLE_HD inline int64_t strided_offset(const Strided& g, int64_t i) {
  int64_t o = g.base;
  for (int d = g.rank - 1; d >= 0; --d) {
    o += (i % g.out[d]) * g.stride[d];
    i /= g.out[d];
  }
  return o;
}

// The sum (mean: divided by width) of one row in float64, rounded once (forward/ops_reduce.cc).
NIBBLE_HD inline float reduce_row(const float* x, int64_t width, bool mean) {
  double acc = 0.0;
  for (int64_t j = 0; j < width; ++j) acc += x[j];
  return float(mean ? acc / double(width) : acc);
}

// Softmax of one row in place (the Softmax operator): softmax_mlas.
NIBBLE_HD inline void softmax_plain_row(float* row, int64_t width) { softmax_mlas(row, width); }

// The offsets in a and b of output element i of a broadcast (forward_types.h).
NIBBLE_HD inline void broadcast_offsets(const Broadcast& g, int64_t i, int64_t& ia, int64_t& ib) {
  ia = ib = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t k = i % g.out[d];
    i /= g.out[d];
    ia += k * g.stride_a[d];
    ib += k * g.stride_b[d];
  }
}

// Head `h` of token (b, s) into the heads' layout ([B, H, S, D]; h < Hq: a query head, then the key heads,
// then the value heads), rotated for position s (queries and keys, when rot_half > 0) and rounded to the
// values' type. `query`, `key`, `value`: the operation's inputs (key and value null when packed).
NIBBLE_HD inline void gather_head(const AttentionShape& g, const float* query, const float* key, const float* value,
                                  const float* cos, const float* sin, int64_t b, int64_t s, int64_t h, float* q,
                                  float* k, float* v) {
  const int64_t D = g.D;
  const float* src;
  float* dst;
  if (h < g.Hq) {
    src = g.packed ? query + (b * g.S + s) * (g.Hq + 2 * g.Hkv) * D + h * D : query + (b * g.S + s) * g.Hq * D + h * D;
    dst = q + ((b * g.Hq + h) * g.S + s) * D;
  } else if (h < g.Hq + g.Hkv) {
    const int64_t kv = h - g.Hq;
    src = g.packed ? query + (b * g.S + s) * (g.Hq + 2 * g.Hkv) * D + h * D : key + (b * g.S + s) * g.Hkv * D + kv * D;
    dst = k + ((b * g.Hkv + kv) * g.S + s) * D;
  } else {
    const int64_t kv = h - g.Hq - g.Hkv;
    src = g.packed ? query + (b * g.S + s) * (g.Hq + 2 * g.Hkv) * D + h * D : value + (b * g.S + s) * g.Hkv * D + kv * D;
    dst = v + ((b * g.Hkv + kv) * g.S + s) * D;
  }
  for (int64_t d = 0; d < D; ++d) dst[d] = src[d];
  if (g.rot_half > 0 && h < g.Hq + g.Hkv) rotate(dst, cos, sin, g.rot_half, g.interleaved, s);
  for (int64_t d = 0; d < D; ++d) dst[d] = hd::round_to(g.round, dst[d]);
}

}  // namespace nibble::kernels::fw

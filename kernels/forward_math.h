// The layer engine's scalar arithmetic, callable from host and device (NIBBLE_HD): the bodies of the
// forward_* operations on every backend (the reference in kernels/cpu/forward_ref.cc, the CUDA backend's
// kernels). Each mirrors the host engine's operator (forward/) operation for operation: no product is
// fused into an add (-ffp-contract=off, nvcc --fmad=false), so +, −, ×, ÷ and sqrt give the host's bits on
// a GPU too; tanh, erf and pow are the device's own there (within their ulp bounds), libm's on the host.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/forward_types.h"
#include "kernels/hd_float.h"

namespace nibble::kernels::fw {

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

NIBBLE_HD inline float sigmoid(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

// Σ x[0..n) in 8 interleaved partial sums folded in a fixed order (forward/fast_exp.h's ordered_sum).
NIBBLE_HD inline float ordered_sum(const float* x, int64_t n) {
  float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += x[i + l];
  for (int l = 0; i < n; ++i, ++l) part[l] += x[i];
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
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
// y = (a − mean) · inv · gamma (+ beta). Null pointers for absent parts.
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
  double s1 = 0.0, s2 = 0.0;
  for (int64_t j = 0; j < width; ++j) {
    float a = x[j];
    if (skip) a += skip[j];
    if (bias) a += bias[j];
    y[j] = a;
    if (sum) sum[j] = hd::round_to(round, a);
    s1 += a;
    s2 += double(a) * a;
  }
  const float mean = rms ? 0.0f : float(s1 / double(width));
  const float var = rms ? float(s2 / double(width)) : float(s2 / double(width) - double(mean) * mean);
  const float inv = 1.0f / sqrt(var + eps);
  for (int64_t j = 0; j < width; ++j) {
    float r = (y[j] - mean) * inv * gamma[j];
    if (beta) r += beta[j];
    y[j] = hd::round_to(round, r);
  }
}

// x (one head, its first 2·rot_half elements) rotated in place for position `pos` (ONNX Runtime's rotary:
// halves, or interleaved pairs).
NIBBLE_HD inline void rotate(float* x, const float* cos, const float* sin, int64_t rot_half, bool interleaved,
                             int64_t pos) {
  const float* cs = cos + pos * rot_half;
  const float* sn = sin + pos * rot_half;
  for (int64_t i = 0; i < rot_half; ++i) {
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + rot_half;
    const float xa = x[a], xb = x[b];
    x[a] = xa * cs[i] - xb * sn[i];
    x[b] = xb * cs[i] + xa * sn[i];
  }
}

// Row s of one head's scores (S of them), in place: scaled (and capped) over the keys it sees, softmaxed,
// zero elsewhere.
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
  for (int64_t j = begin; j < end; ++j) row[j] = exp_fast(row[j] - m);
  const float total = ordered_sum(row + begin, end - begin);
  for (int64_t j = 0; j < S; ++j) row[j] = j >= begin && j < end ? row[j] / total : 0.0f;
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

// Softmax of one row in place (the Softmax operator: the max, exp of the shifted values, their 8-lane sum).
NIBBLE_HD inline void softmax_plain_row(float* row, int64_t width) {
  float m = -INFINITY;
  for (int64_t j = 0; j < width; ++j) m = m < row[j] ? row[j] : m;
  for (int64_t j = 0; j < width; ++j) row[j] = exp_fast(row[j] - m);
  const float s = ordered_sum(row, width);
  for (int64_t j = 0; j < width; ++j) row[j] /= s;
}

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

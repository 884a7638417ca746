// Rounding learned on a whole decoder layer's output (AutoRound's parametrisation, Cheng et al. 2023), one
// weight's element-wise math in one source: the host's threads run these functions element by element,
// a device's kernels would run the same bodies one thread per element.
//
// Each weight element has an offset v ∈ [-0.5, 0.5] added to its unrounded level before rounding, and each
// block's scale a factor 1 + f, f ∈ [-kScaleRange, kScaleRange]:
//   scale = round_to_type(scale0 · (1 + f)),   level = clamp(rint(w / scale + z + v), lowest, highest),
//   ŵ = (level − z) · scale,  and the graph reads ŵ / s_k · d_n (AWQ's s along K, a consumer's divisor along N).
// Gradients pass straight through rint (and through the scale's rounding): given g = ∂L/∂(graph element),
//   ∂L/∂v = g · scale / s_k · d_n where the level is not clamped (else 0),
//   ∂L/∂f = Σ_block g / s_k · d_n · scale0 · (level − z − (w / scale) · [not clamped]).
// Sign steps (AutoRound's update) move v and f by ±lr. z (zero points) stays as it started.
#pragma once
#include <cstdint>

#include "kernels/hd_float.h"

namespace nibble::kernels::layer_round {

constexpr float kOffsetRange = 0.5f;
constexpr float kScaleRange = 0.2f;

// One weight's problem, in device-neutral pointers.
struct Weight {
  int64_t rows = 0, cols = 0;
  int k_axis = 0;
  int64_t block = 128;
  int bits = 4;
  bool zero_point = false;
  int scale_dtype = hd::kF32;
  const float* w = nullptr;        // W' = W ⊙ s (/ d), float32, laid out as the weight
  const float* scale0 = nullptr;   // the starting block scales, laid out as QuantResult's
  const uint8_t* zp = nullptr;     // zero points (zero_point), laid out as the scales
  const float* s = nullptr;        // AWQ's s (K values), or null
  const float* divisor = nullptr;  // d (N values), or null
  float* v = nullptr;              // offsets, laid out as the weight
  float* f = nullptr;              // scale factors − 1, laid out as the scales

  NIBBLE_HD int64_t K() const { return k_axis == 0 ? rows : cols; }
  NIBBLE_HD int64_t N() const { return k_axis == 0 ? cols : rows; }
  NIBBLE_HD int64_t G() const { return (K() + block - 1) / block; }
  NIBBLE_HD int64_t index(int64_t k, int64_t n) const { return k_axis == 0 ? k * cols + n : n * cols + k; }
  NIBBLE_HD int64_t param(int64_t k, int64_t n) const {
    const int64_t g = k / block;
    return k_axis == 0 ? g * cols + n : n * G() + g;
  }
  NIBBLE_HD float lowest() const { return zero_point ? 0.0f : -float(1 << (bits - 1)); }
  NIBBLE_HD float highest() const { return zero_point ? float((1 << bits) - 1) : float((1 << (bits - 1)) - 1); }
  NIBBLE_HD float zero(int64_t p) const { return zero_point ? float(zp[p]) : 0.0f; }
  // What the graph reads per unit of ŵ at (k, n): 1 / s_k · d_n.
  NIBBLE_HD float graph_factor(int64_t k, int64_t n) const {
    float x = s ? 1.0f / s[k] : 1.0f;
    if (divisor) x *= divisor[n];
    return x;
  }
};

NIBBLE_HD inline float scale_of(const Weight& p, int64_t param) {
  return hd::round_to(p.scale_dtype, p.scale0[param] * (1.0f + p.f[param]));
}

// What an element's math reads of its block, taken once per block.
struct Block {
  float scale = 1.0f;   // the current scale (scale_of)
  float scale0 = 1.0f;  // the starting one
  float zero = 0.0f;
};

NIBBLE_HD inline Block block_of(const Weight& p, int64_t param) {
  return Block{scale_of(p, param), p.scale0[param], p.zero(param)};
}

// Element (k, n)'s level with its offset, and whether the clamp held it (then no gradient reaches v).
NIBBLE_HD inline float level_of(const Weight& p, int64_t k, int64_t n, const Block& b, bool* clamped) {
  const int64_t i = p.index(k, n);
  const float x = hd::rint(p.w[i] / b.scale + b.zero + p.v[i]);
  *clamped = x < p.lowest() || x > p.highest();
  return x < p.lowest() ? p.lowest() : (x > p.highest() ? p.highest() : x);
}

// The graph's element (k, n): ŵ / s_k · d_n.
NIBBLE_HD inline float graph_element(const Weight& p, int64_t k, int64_t n, const Block& b) {
  bool clamped;
  const float level = level_of(p, k, n, b, &clamped);
  return (level - b.zero) * b.scale * p.graph_factor(k, n);
}

// ∂L/∂v of element (k, n) and its share of ∂L/∂f of its block, from g = ∂L/∂(graph element).
NIBBLE_HD inline void element_gradients(const Weight& p, int64_t k, int64_t n, const Block& b, float g, float* dv,
                                        float* df_share) {
  bool clamped;
  const float level = level_of(p, k, n, b, &clamped);
  const float gw = g * p.graph_factor(k, n);  // ∂L/∂ŵ
  *dv = clamped ? 0.0f : gw * b.scale;
  const float u = clamped ? 0.0f : p.w[p.index(k, n)] / b.scale;
  *df_share = gw * b.scale0 * (level - b.zero - u);
}

// One sign step of `step` against the gradient, kept within ±range.
NIBBLE_HD inline float sign_step(float x, float grad, float step, float range) {
  x -= step * float(int(grad > 0.0f) - int(grad < 0.0f));  // no branch: the signs are random
  return x < -range ? -range : (x > range ? range : x);
}

// Block column (g, n) of the graph's weight into `out` (laid out as the weight).
NIBBLE_HD inline void weight_block(const Weight& p, int64_t g, int64_t n, float* out) {
  const int64_t k0 = g * p.block, k1 = k0 + p.block < p.K() ? k0 + p.block : p.K();
  const Block b = block_of(p, p.param(k0, n));
  for (int64_t k = k0; k < k1; ++k) out[p.index(k, n)] = graph_element(p, k, n, b);
}

// One sign step of block column (g, n) in place: each offset against its gradient (grad: ∂L/∂ the graph's
// weight, laid out as it), then the block's factor against its elements' shares summed in k order.
NIBBLE_HD inline void step_block(const Weight& p, int64_t g, int64_t n, const float* grad, float size) {
  const int64_t k0 = g * p.block, k1 = k0 + p.block < p.K() ? k0 + p.block : p.K();
  const int64_t pi = p.param(k0, n);
  const Block b = block_of(p, pi);
  float df = 0.0f;
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t i = p.index(k, n);
    float dv, share;
    element_gradients(p, k, n, b, grad[i], &dv, &share);
    df += share;
    p.v[i] = sign_step(p.v[i], dv, size, kOffsetRange);
  }
  p.f[pi] = sign_step(p.f[pi], df, size, kScaleRange);
}

// step_block, then the block column's graph weight from the new offsets and factor into `out`.
NIBBLE_HD inline void step_block_weight(const Weight& p, int64_t g, int64_t n, const float* grad, float size, float* out) {
  step_block(p, g, n, grad, size);
  weight_block(p, g, n, out);
}

// The final code of element (k, n) (the level as the writers store it).
NIBBLE_HD inline uint8_t code_of(const Weight& p, int64_t k, int64_t n, const Block& b) {
  bool clamped;
  const float level = level_of(p, k, n, b, &clamped);
  return p.zero_point ? uint8_t(int(level)) : uint8_t(int8_t(int(level)));
}

}  // namespace nibble::kernels::layer_round

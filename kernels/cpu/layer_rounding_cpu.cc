#include "kernels/cpu/layer_rounding_cpu.h"

#include <algorithm>
#include <vector>

#include "kernels/layer_round_problem.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

namespace lr = layer_round;

const float* host_floats(const Tensor& t, const char* op) {
  if (t.elements() > 0 && !t.data) throw std::invalid_argument(std::string(op) + ": a tensor with no host data");
  return t.f32();
}

// The view over x's host arrays, v and f replaced by `v`, `f` (the step's copies, or x's own to read).
lr::Weight host_view_of(const LayerRoundProblem& p, const LayerRoundParams& x, float* v, float* f, const char* op) {
  return lr::view(p, host_floats(p.w, op), host_floats(p.scale0, op),
                  static_cast<const uint8_t*>(p.zero_points.data), host_floats(p.s, op), host_floats(p.divisor, op),
                  v ? v : const_cast<float*>(host_floats(x.v, op)), f ? f : const_cast<float*>(host_floats(x.f, op)));
}

// Tiles of columns side by side; within a tile, blocks in order and a block's rows in order, so every
// block's sum is taken in k order as the reference takes it.
constexpr int64_t kTile = 64;

template <class Element, class BlockDone, class BlockAfter>
void sweep(const lr::Weight& p, const Element& element, const BlockDone& block_done, const BlockAfter& block_after) {
  const int64_t N = p.N(), K = p.K();
  parallel_for((N + kTile - 1) / kTile, [&](int64_t t) {
    const int64_t n0 = t * kTile, n1 = std::min(N, n0 + kTile);
    lr::Block block[kTile];
    float df[kTile];
    for (int64_t k0 = 0; k0 < K; k0 += p.block) {
      for (int64_t n = n0; n < n1; ++n) block[n - n0] = lr::block_of(p, p.param(k0, n)), df[n - n0] = 0.0f;
      const int64_t k1 = std::min(K, k0 + p.block);
      for (int64_t k = k0; k < k1; ++k)
        for (int64_t n = n0; n < n1; ++n) element(k, n, block[n - n0], df[n - n0]);
      for (int64_t n = n0; n < n1; ++n) block_done(k0, n, df[n - n0]);
      block_after(k0, k1, n0, n1);
    }
  });
}

// ---- A [K, N] weight (k_axis 0), a tile's row at a time: the element math of kernels/layer_rounding.h
// written over arrays (a block's scale, starting scale and zero point per column, the graph's factor per
// column of the row) so that the compiler vectorizes across the row; every expression is the element
// function's, in its order, so the bits are the reference's.

// hd::rint without its branch (a select instead).
inline float rint_select(float x) {
  const float a = hd::fabs(x);
  const float r = bits_f32(f32_bits((a + 8388608.0f) - 8388608.0f) | (f32_bits(x) & 0x80000000u));
  return a < 8388608.0f ? r : x;
}

inline float clamp_range(float x, float range) { return x < -range ? -range : (x > range ? range : x); }

struct TileColumns {  // the current block of a tile's columns
  alignas(64) float scale[kTile], scale0[kTile], zero[kTile], df[kTile], factor[kTile];
  int64_t n0 = 0, width = 0;

  void take_blocks(const lr::Weight& p, int64_t k0) {
    for (int64_t j = 0; j < width; ++j) {
      const lr::Block b = lr::block_of(p, p.param(k0, n0 + j));
      scale[j] = b.scale, scale0[j] = b.scale0, zero[j] = b.zero;
    }
  }
  // graph_factor(k, n) of the row's columns.
  void take_factors(const lr::Weight& p, int64_t k) {
    const float inv = p.s ? 1.0f / p.s[k] : 1.0f;
    if (p.divisor)
      for (int64_t j = 0; j < width; ++j) factor[j] = inv * p.divisor[n0 + j];
    else
      for (int64_t j = 0; j < width; ++j) factor[j] = inv;
  }
};

// element_gradients and the offset's sign step over one row of the tile; the factors' shares into df.
void step_row(const TileColumns& c, const float* __restrict w, const float* __restrict g, float* __restrict v,
              float* __restrict df, float lo, float hi, float size) {
  for (int64_t j = 0; j < c.width; ++j) {
    const float q = w[j] / c.scale[j];
    const float x = rint_select(q + c.zero[j] + v[j]);
    const bool clamped = (x < lo) | (x > hi);
    const float level = std::min(std::max(x, lo), hi);  // x < lo ? lo : (x > hi ? hi : x), NaN and -0 alike
    const float gw = g[j] * c.factor[j];
    const float dv = clamped ? 0.0f : gw * c.scale[j];
    const float u = clamped ? 0.0f : q;
    df[j] += gw * c.scale0[j] * (level - c.zero[j] - u);
    const float sign = dv > 0.0f ? 1.0f : (dv < 0.0f ? -1.0f : 0.0f);
    v[j] = clamp_range(v[j] - size * sign, lr::kOffsetRange);
  }
}

// graph_element over one row of the tile.
void weight_row(const TileColumns& c, const float* __restrict w, const float* __restrict v, float* __restrict out,
                float lo, float hi) {
  for (int64_t j = 0; j < c.width; ++j) {
    const float x = rint_select(w[j] / c.scale[j] + c.zero[j] + v[j]);
    const float level = std::min(std::max(x, lo), hi);
    out[j] = (level - c.zero[j]) * c.scale[j] * c.factor[j];
  }
}

// The fast sweep of a [K, N] weight: with `grad`, a step (offsets, then each block's factor) and the new
// weight of the block's rows while they are in cache; without, the weight alone.
void sweep_rows(const lr::Weight& p, const float* grad, float size, float* out) {
  const int64_t N = p.N(), K = p.K(), cols = p.cols;
  const float lo = p.lowest(), hi = p.highest();
  parallel_for((N + kTile - 1) / kTile, [&](int64_t t) {
    TileColumns c;
    c.n0 = t * kTile, c.width = std::min(N, c.n0 + kTile) - c.n0;
    for (int64_t k0 = 0; k0 < K; k0 += p.block) {
      const int64_t k1 = std::min(K, k0 + p.block);
      c.take_blocks(p, k0);
      if (grad) {
        std::fill(c.df, c.df + c.width, 0.0f);
        for (int64_t k = k0; k < k1; ++k) {
          c.take_factors(p, k);
          const int64_t i = k * cols + c.n0;
          step_row(c, p.w + i, grad + i, p.v + i, c.df, lo, hi, size);
        }
        for (int64_t j = 0; j < c.width; ++j) {
          float& fi = p.f[p.param(k0, c.n0 + j)];
          fi = lr::sign_step(fi, c.df[j], size, lr::kScaleRange);
        }
        c.take_blocks(p, k0);
      }
      for (int64_t k = k0; k < k1; ++k) {
        c.take_factors(p, k);
        const int64_t i = k * cols + c.n0;
        weight_row(c, p.w + i, p.v + i, out + i, lo, hi);
      }
    }
  });
}

Tensor weight_of(const LayerRoundProblem& p, const LayerRoundParams& x, bool fast) {
  lr::check(p, x, nullptr, "layer_round_weight");
  const lr::Weight w = host_view_of(p, x, nullptr, nullptr, "layer_round_weight");
  std::vector<float> out(size_t(p.rows * p.cols));
  if (fast && p.k_axis == 0) {
    sweep_rows(w, nullptr, 0.0f, out.data());
  } else if (fast) {
    sweep(
        w, [&](int64_t k, int64_t n, const lr::Block& b, float&) { out[size_t(w.index(k, n))] = lr::graph_element(w, k, n, b); },
        [](int64_t, int64_t, float) {}, [](int64_t, int64_t, int64_t, int64_t) {});
  } else {
    for (int64_t n = 0; n < w.N(); ++n)
      for (int64_t g = 0; g < w.G(); ++g) lr::weight_block(w, g, n, out.data());
  }
  return host_tensor(DType::kFloat32, {p.rows, p.cols}, std::move(out));
}

LayerRoundParams step_of(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g, float size, bool fast) {
  lr::check(p, x, &g, "layer_round_step");
  const float* grad = host_floats(g, "layer_round_step");
  const float* v0 = host_floats(x.v, "layer_round_step");
  const float* f0 = host_floats(x.f, "layer_round_step");
  std::vector<float> v(v0, v0 + x.v.elements()), f(f0, f0 + x.f.elements()), out(size_t(p.rows * p.cols));
  const lr::Weight w = host_view_of(p, x, v.data(), f.data(), "layer_round_step");
  if (fast && p.k_axis == 0) {
    sweep_rows(w, grad, size, out.data());
  } else if (fast) {
    sweep(
        w,
        [&](int64_t k, int64_t n, const lr::Block& b, float& df) {
          const int64_t i = w.index(k, n);
          float dv, share;
          lr::element_gradients(w, k, n, b, grad[i], &dv, &share);
          df += share;
          w.v[i] = lr::sign_step(w.v[i], dv, size, lr::kOffsetRange);
        },
        [&](int64_t k0, int64_t n, float df) {
          float& fi = w.f[w.param(k0, n)];
          fi = lr::sign_step(fi, df, size, lr::kScaleRange);
        },
        [&](int64_t k0, int64_t k1, int64_t n0, int64_t n1) {  // the block rows again, still in cache
          lr::Block b[kTile];
          for (int64_t n = n0; n < n1; ++n) b[n - n0] = lr::block_of(w, w.param(k0, n));
          for (int64_t k = k0; k < k1; ++k)
            for (int64_t n = n0; n < n1; ++n) out[size_t(w.index(k, n))] = lr::graph_element(w, k, n, b[n - n0]);
        });
  } else {
    for (int64_t n = 0; n < w.N(); ++n)
      for (int64_t b = 0; b < w.G(); ++b) lr::step_block_weight(w, b, n, grad, size, out.data());
  }
  const std::vector<int64_t> vs = x.v.shape, fs = x.f.shape;
  return LayerRoundParams{host_tensor(DType::kFloat32, vs, std::move(v)), host_tensor(DType::kFloat32, fs, std::move(f)),
                          host_tensor(DType::kFloat32, {p.rows, p.cols}, std::move(out))};
}

}  // namespace

Tensor layer_round_weight_ref(const LayerRoundProblem& p, const LayerRoundParams& x) { return weight_of(p, x, false); }
LayerRoundParams layer_round_step_ref(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g, float size) {
  return step_of(p, x, g, size, false);
}
Tensor layer_round_weight_fast(const LayerRoundProblem& p, const LayerRoundParams& x) { return weight_of(p, x, true); }
LayerRoundParams layer_round_step_fast(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g,
                                       float size) {
  return step_of(p, x, g, size, true);
}

}  // namespace nibble::kernels

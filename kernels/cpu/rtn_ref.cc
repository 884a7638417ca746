#include "kernels/cpu/rtn_ref.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

// numpy divides fp16 arrays in fp32 and rounds the quotient to fp16; bf16 codes stay in fp32.
inline float code_quotient(float w, float s, DType t) {
  const float q = w / s;
  return t == DType::kFloat16 ? round_to(t, q) : q;
}

constexpr int64_t kColsPerTile = 1024;  // axis-0 tiles: one block-row x this many columns
constexpr int64_t kRowsPerTile = 16;    // axis-1 tiles: this many output channels

}  // namespace

void check_spec(const QuantSpec& spec) {
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
}

float min_scale(DType t) { return hd::min_scale(int(t)); }

// The formulas are written once, NIBBLE_HD, for every backend (kernels/hd_float.h).
BlockParams block_params_symmetric(float amax, int bits, DType t) {
  BlockParams p;
  p.scale = hd::params_symmetric(amax, bits, int(t)).scale;
  return p;
}

BlockParams block_params_zero_point(float mn, float mx, int bits, DType t) {
  const hd::Params h = hd::params_zero_point(mn, mx, bits, int(t));
  BlockParams p;
  p.scale = h.scale;
  p.zero_point = h.zero_point;
  return p;
}

uint8_t quantize_value(float w, const BlockParams& p, int bits, bool zero_point, DType t) {
  const float r = std::nearbyint(code_quotient(w, p.scale, t));
  if (zero_point) {
    const float maxq = float((1 << bits) - 1);
    return uint8_t(std::clamp(r + float(p.zero_point), 0.0f, maxq));
  }
  const float lo = -float(1 << (bits - 1)), hi = float((1 << (bits - 1)) - 1);
  return uint8_t(int8_t(std::clamp(r, lo, hi)));
}

float dequantize_value(uint8_t code, const BlockParams& p, int bits, bool zero_point) {
  (void)bits;
  const int q = zero_point ? int(code) - int(p.zero_point) : int(int8_t(code));
  return float(q) * p.scale;
}

void rtn_quantize_ref(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), bs = spec.block;
  const int64_t G = num_blocks(K, bs);
  const bool zp = spec.zero_point;
  const bool ort = spec.rtn_arithmetic == RtnArithmetic::kOnnxRuntime;
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.assign(zp ? size_t(G * N) : 0, 0);

  // Scales/zero points are stored [G, N] for k_axis 0 and [N, G] for k_axis 1.
  auto param_index = [&](int64_t g, int64_t n) { return w.param_index(G, g, n); };
  auto elem_index = [&](int64_t k, int64_t n) { return w.index(k, n); };

  // One tile = a set of (block, channel) pairs; tiles are fixed by the shape alone.
  int64_t tiles;
  if (w.k_axis == 0) {
    tiles = G * num_blocks(N, kColsPerTile);
  } else {
    tiles = num_blocks(N, kRowsPerTile);
  }
  std::vector<double> tile_error(size_t(tiles), 0.0);

  auto do_block = [&](int64_t g, int64_t n, double& err) {
    const int64_t k0 = g * bs, k1 = std::min(K, k0 + bs);
    const bool partial = (k1 - k0) < bs;  // ModelOpt zero-pads the last block
    BlockParams p;
    if (zp || ort) {  // ONNX Runtime's symmetric RTN reads min and max too (the one of larger magnitude)
      float mn = partial ? 0.0f : INFINITY, mx = partial ? 0.0f : -INFINITY;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = load_float(w.dtype, w.data, size_t(elem_index(k, n)));
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      if (ort) {
        const hd::Params h = zp ? hd::params_zero_point_ort(mn, mx, spec.bits, int(w.dtype))
                                : hd::params_symmetric_ort(mn, mx, spec.bits, int(w.dtype));
        p.scale = h.scale, p.zero_point = h.zero_point;
      } else {
        p = block_params_zero_point(mn, mx, spec.bits, w.dtype);
      }
      if (zp) out.zero_points[size_t(param_index(g, n))] = p.zero_point;
    } else {
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = std::fabs(load_float(w.dtype, w.data, size_t(elem_index(k, n))));
        amax = (v > amax || std::isnan(v)) ? v : amax;
      }
      p = block_params_symmetric(amax, spec.bits, w.dtype);
    }
    out.scales[size_t(param_index(g, n))] = p.scale;
    const float reciprocal = hd::reciprocal_ort(p.scale);
    // The block's error in element order: in float for fp16 weights (|w - ŵ|² ≤ 65504², no overflow), in
    // double for the wider types; the blocks' sums in double.
    const bool f16 = w.dtype == DType::kFloat16;
    float block_err = 0.0f;
    double block_err_wide = 0.0;
    for (int64_t k = k0; k < k1; ++k) {
      const size_t i = size_t(elem_index(k, n));
      const float v = load_float(w.dtype, w.data, i);
      const uint8_t c = !ort ? quantize_value(v, p, spec.bits, zp, w.dtype)
                        : zp   ? hd::quantize_ort(v, reciprocal, p.zero_point, spec.bits)
                               : hd::quantize_symmetric_ort(v, reciprocal, spec.bits);
      out.codes[i] = c;
      // The error of the weight the model will really use: DequantizeLinear's output dtype.
      const float dq = round_to(w.dtype, dequantize_value(c, p, spec.bits, zp));
      if (f16) {
        const float d = v - dq;
        block_err += d * d;
      } else {
        const double d = double(v) - double(dq);
        block_err_wide += d * d;
      }
    }
    err += f16 ? double(block_err) : block_err_wide;
  };

  parallel_for(tiles, [&](int64_t t) {
    double err = 0;
    if (w.k_axis == 0) {
      const int64_t col_tiles = num_blocks(N, kColsPerTile);
      const int64_t g = t / col_tiles, c0 = (t % col_tiles) * kColsPerTile;
      const int64_t c1 = std::min(N, c0 + kColsPerTile);
      for (int64_t n = c0; n < c1; ++n) do_block(g, n, err);
    } else {
      const int64_t n0 = t * kRowsPerTile, n1 = std::min(N, n0 + kRowsPerTile);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t g = 0; g < G; ++g) do_block(g, n, err);
    }
    tile_error[size_t(t)] = err;
  });
  out.sq_error = 0;
  for (double e : tile_error) out.sq_error += e;
  if (out.pack && spec.bits == 4) {  // ONNX INT4: element 2i in the low nibble, 2i + 1 in the high one
    out.packed.assign((out.codes.size() + 1) / 2, 0);
    for (size_t i = 0; i < out.codes.size(); ++i) out.packed[i / 2] |= uint8_t((out.codes[i] & 0x0f) << (4 * (i & 1)));
    out.codes.clear();
  }
}

}  // namespace nibble::kernels

namespace nibble::kernels {

void rtn_quantize_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* weight,
                           const std::vector<float>& ratios, QuantResult& out) {
  if (ratios.empty()) throw std::invalid_argument("rtn_quantize_weighted: no clip ratio to try");
  const int64_t K = w.K(), N = w.N(), bs = spec.block;
  const int64_t G = num_blocks(K, bs);
  const bool zp = spec.zero_point;
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.assign(zp ? size_t(G * N) : 0, 0);
  auto param_index = [&](int64_t g, int64_t n) { return w.param_index(G, g, n); };
  auto elem_index = [&](int64_t k, int64_t n) { return w.index(k, n); };
  std::vector<double> col_error(size_t(N), 0.0);
  parallel_for(N, [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(bs));
    double total = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * bs, k1 = std::min(K, k0 + bs);
      const bool partial = (k1 - k0) < bs;
      float amax = 0, mn = partial ? 0.0f : INFINITY, mx = partial ? 0.0f : -INFINITY;
      for (int64_t k = k0; k < k1; ++k) {
        v[size_t(k - k0)] = load_float(w.dtype, w.data, size_t(elem_index(k, n)));
        amax = std::max(amax, std::fabs(v[size_t(k - k0)]));
        mn = std::min(mn, v[size_t(k - k0)]);
        mx = std::max(mx, v[size_t(k - k0)]);
      }
      const DType st = scale_type(spec, w.dtype);
      // Candidate 0 when none has an error below +inf (NaN or inf energy): never an unset scale.
      BlockParams best = clip_candidate(ratios, 0, amax, mn, mx, spec.bits, zp, st);
      double best_err = INFINITY;
      // The second half of the candidates negates the scale: the block's extreme value then lands on
      // the otherwise unused code -2^(b-1) (ONNX Runtime's 16-level symmetric grid).
      for (size_t ri = 0; ri < ratios.size() * (zp ? 1 : 2); ++ri) {
        const BlockParams p = clip_candidate(ratios, int64_t(ri), amax, mn, mx, spec.bits, zp, st);
        double err = 0;
        for (int64_t k = k0; k < k1; ++k) {
          const float x = v[size_t(k - k0)];
          const float d = x - round_to(w.dtype, dequantize_value(quantize_value(x, p, spec.bits, zp, w.dtype), p,
                                                                  spec.bits, zp));
          err += double(weight[k]) * double(d) * double(d);
        }
        if (err < best_err) {
          best_err = err;
          best = p;
        }
      }
      out.scales[size_t(param_index(g, n))] = best.scale;
      if (zp) out.zero_points[size_t(param_index(g, n))] = best.zero_point;
      for (int64_t k = k0; k < k1; ++k) {
        const float x = v[size_t(k - k0)];
        const uint8_t c = quantize_value(x, best, spec.bits, zp, w.dtype);
        out.codes[size_t(elem_index(k, n))] = c;
        const double d = double(x) - double(round_to(w.dtype, dequantize_value(c, best, spec.bits, zp)));
        total += d * d;
      }
    }
    col_error[size_t(n)] = total;
  });
  out.sq_error = 0;
  for (double e : col_error) out.sq_error += e;
}

}  // namespace nibble::kernels

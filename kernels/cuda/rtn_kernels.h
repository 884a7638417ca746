// Kernel bodies of the RTN family, one thread per (block g, column n) with n fastest, so that the
// threads of a warp read consecutive columns of a [K, N] weight (coalesced). Each body is the
// reference's per-block loop (rtn_ref.h, clip_ref.h) with the same operations in the same order,
// hence the same codes, scales and zero points; its error goes to block_error[g * N + n] and the
// backend sums those in a fixed order. (Plain RTN of a [N, K] weight, where a block's values are
// adjacent, runs a warp per block instead: rtn_blocks.h.)
#pragma once
#include "kernels/clip_candidate.h"
#include "kernels/cuda/hd_float.h"

namespace nibble::kernels::gpu {

// A weight in device memory, as kernels::WeightMatrix (k_axis 0: [K, N]; 1: [N, K]).
struct WeightView {
  const void* data;
  int dtype;
  int64_t rows, cols;
  int k_axis;
  NIBBLE_HD int64_t K() const { return k_axis == 0 ? rows : cols; }
  NIBBLE_HD int64_t N() const { return k_axis == 0 ? cols : rows; }
  NIBBLE_HD int64_t index(int64_t k, int64_t n) const { return k_axis == 0 ? k * cols + n : n * cols + k; }
  NIBBLE_HD int64_t param(int64_t G, int64_t g, int64_t n) const { return k_axis == 0 ? g * cols + n : n * G + g; }
  NIBBLE_HD float at(int64_t k, int64_t n) const { return hd::load(dtype, data, index(k, n)); }
};

struct QuantOut {
  uint8_t* codes;
  float* scales;
  uint8_t* zero_points;  // null unless zero point
  double* block_error;   // [G * N]
};

struct BlockShape {
  int bits;
  int64_t block;
  bool zero_point;
  int scale_dtype;  // what scales are rounded to
  // Plain RTN in ONNX Runtime's arithmetic, symmetric or with a zero point (QuantSpec::rtn_arithmetic;
  // RtnBody and RtnWarpBlocks only).
  bool ort = false;
  // Whether a block's parameters come from its min and max (else from its amax).
  NIBBLE_HD bool min_max() const { return zero_point || ort; }
};

// A block's parameters from its min and max (BlockShape::min_max) in the arithmetic `s` names.
NIBBLE_HD inline hd::Params min_max_params(const BlockShape& s, float mn, float mx, int dtype) {
  if (!s.ort) return hd::params_zero_point(mn, mx, s.bits, dtype);
  return s.zero_point ? hd::params_zero_point_ort(mn, mx, s.bits, dtype) : hd::params_symmetric_ort(mn, mx, s.bits, dtype);
}
// A code in the arithmetic `s` names; `reciprocal` is hd::reciprocal_ort(p.scale).
NIBBLE_HD inline uint8_t code_of(const BlockShape& s, float v, hd::Params p, float reciprocal, int dtype) {
  if (!s.ort) return hd::quantize(v, p, s.bits, s.zero_point, dtype);
  return s.zero_point ? hd::quantize_ort(v, reciprocal, p.zero_point, s.bits)
                      : hd::quantize_symmetric_ort(v, reciprocal, s.bits);
}

// Codes of block (g, n) with params p; returns Σ (w - ŵ)², ŵ in the weight dtype, summed in Acc (k ascending):
// plain RTN's blocks sum fp16 weights' errors in float (rtn_quantize_ref), everything else in double.
template <class Acc = double>
NIBBLE_HD inline double write_block(const WeightView& w, const BlockShape& s, int64_t k0, int64_t k1, int64_t n,
                                    hd::Params p, uint8_t* codes) {
  Acc err = 0;
  const float reciprocal = hd::reciprocal_ort(p.scale);
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t i = w.index(k, n);
    const float v = hd::load(w.dtype, w.data, i);
    const uint8_t c = code_of(s, v, p, reciprocal, w.dtype);
    codes[i] = c;
    const Acc d = Acc(v) - Acc(hd::round_to(w.dtype, hd::dequantize(c, p, s.zero_point)));
    err += d * d;
  }
  return double(err);
}

NIBBLE_HD inline void store_params(const WeightView& w, const BlockShape& s, const QuantOut& o, int64_t G, int64_t g,
                                   int64_t n, hd::Params p, double err) {
  const int64_t pi = w.param(G, g, n);
  o.scales[pi] = p.scale;
  if (s.zero_point) o.zero_points[pi] = p.zero_point;
  o.block_error[g * w.N() + n] = err;
}

// Plain RTN (rtn_quantize_ref).
struct RtnBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const bool partial = (k1 - k0) < s.block;  // ModelOpt zero-pads the last block
    hd::Params p;
    if (s.min_max()) {
      float mn = partial ? 0.0f : INFINITY, mx = partial ? 0.0f : -INFINITY;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = w.at(k, n);
        mn = hd::min(mn, v);
        mx = hd::max(mx, v);
      }
      p = min_max_params(s, mn, mx, w.dtype);
    } else {
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = hd::fabs(w.at(k, n));
        amax = (v > amax || hd::isnan(v)) ? v : amax;
      }
      p = hd::params_symmetric(amax, s.bits, w.dtype);
    }
    store_params(w, s, o, G, g, n, p,
                 w.dtype == hd::kF16 ? write_block<float>(w, s, k0, k1, n, p, o.codes)
                                     : write_block<double>(w, s, k0, k1, n, p, o.codes));
  }
};

// Candidate ci of a block, the step every backend shares (kernels/clip_candidate.h).
NIBBLE_HD inline hd::Params candidate(const float* ratios, int64_t R, int64_t ci, float amax, float mn, float mx,
                                      const BlockShape& s) {
  return hd::clip_candidate(ratios, R, ci, amax, mn, mx, s.bits, s.zero_point, s.scale_dtype);
}

struct BlockRange {
  float amax, mn, mx;
};
NIBBLE_HD inline BlockRange block_range(const WeightView& w, int64_t k0, int64_t k1, int64_t n, bool partial) {
  BlockRange b{0.0f, partial ? 0.0f : INFINITY, partial ? 0.0f : -INFINITY};
  for (int64_t k = k0; k < k1; ++k) {
    const float v = w.at(k, n);
    b.amax = hd::max(b.amax, hd::fabs(v));
    b.mn = hd::min(b.mn, v);
    b.mx = hd::max(b.mx, v);
  }
  return b;
}

// RTN with a per-block clip ratio chosen by the error weighted per channel (rtn_quantize_weighted).
struct RtnWeightedBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  const float* weight;  // [K]
  const float* ratios;
  int64_t R;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const BlockRange b = block_range(w, k0, k1, n, (k1 - k0) < s.block);
    hd::Params best = candidate(ratios, R, 0, b.amax, b.mn, b.mx, s);
    double best_err = INFINITY;
    const int64_t C = R * (s.zero_point ? 1 : 2);
    // The block walked by a pointer step (k_axis 0: a row apart, 1: adjacent) and a count: fewer live
    // 64-bit index temporaries than w.at(k, n), which kept this kernel spilling registers.
    const int64_t first = w.index(k0, n), step = w.k_axis == 0 ? w.cols : 1;
    const int len = int(k1 - k0);
    for (int64_t ci = 0; ci < C; ++ci) {
      const hd::Params p = candidate(ratios, R, ci, b.amax, b.mn, b.mx, s);
      double err = 0;
      for (int j = 0; j < len; ++j) {
        const float x = hd::load(w.dtype, w.data, first + j * step);
        const float d = x - hd::round_to(w.dtype, hd::dequantize(hd::quantize(x, p, s.bits, s.zero_point, w.dtype), p,
                                                                 s.zero_point));
        err += double(weight[k0 + j]) * double(d) * double(d);
      }
      if (err < best_err) {
        best_err = err;
        best = p;
      }
    }
    store_params(w, s, o, G, g, n, best, write_block(w, s, k0, k1, n, best, o.codes));
  }
};

// Symmetric RTN with a given ratio per block (rtn_quantize_ratios; ratio_ng index n * G + g).
struct RtnRatiosBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  const float* ratio_ng;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const int dt = w.dtype;
    const float r = hd::round_to(dt, ratio_ng[n * G + g]);
    float amax = 0;
    for (int64_t k = k0; k < k1; ++k) amax = hd::max(amax, hd::fabs(w.at(k, n)));
    // ModelOpt's step, not clip_candidate: the ratio and r·amax are rounded to the weight dtype (numpy).
    const hd::Params p = hd::params_symmetric(hd::round_to(dt, amax * r), s.bits, dt);
    store_params(w, s, o, G, g, n, p, write_block(w, s, k0, k1, n, p, o.codes));
  }
};

// Scales rounded to a 16-bit type already, in that type (exact): what comes back over the bus.
struct NarrowScalesBody {
  const float* in;
  int dtype;  // kF16 or kBF16
  uint16_t* out;
  NIBBLE_HD void operator()(int64_t i) const {
    out[i] = dtype == hd::kF16 ? hd::float_to_half(in[i]) : hd::float_to_bf16(in[i]);
  }
};

// Per column n of a panel, the sum of its block errors err[g * width + n] over g in order.
struct ColumnSumBody {
  const double* err;
  int64_t G, width;
  double* out;
  NIBBLE_HD void operator()(int64_t n) const {
    double t = 0;
    for (int64_t g = 0; g < G; ++g) t += err[g * width + n];
    out[n] = t;
  }
};

}  // namespace nibble::kernels::gpu

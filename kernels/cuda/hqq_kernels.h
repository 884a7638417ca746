// Kernel bodies of hqq on the device: one thread per (block g, column n), n fastest (coalesced reads of
// a [K, N] weight). Each calls kernels/hqq_fit.h's fit, the very function the CPU backend calls on its
// gathered copy of the block; here the block is read in place (lsq::Block), so a thread holds the
// fit's running sums, never the block. The codes and the error then follow as the CPU's per-block
// drivers (kernels/cpu/search_ref.cc) write them, so every output is the CPU's bit for bit.
#pragma once
#include "kernels/cuda/rtn_kernels.h"
#include "kernels/cuda/search_kernels.h"
#include "kernels/hqq_fit.h"

namespace nibble::kernels::gpu {

// HQQ with integer zero points (HqqOptions::float_zero_point off): RTN codes of the fitted (s, z).
struct HqqBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  HqqOptions opt;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const lsq::Block x{w.data, w.dtype, w.index(k0, n), w.k_axis == 0 ? w.cols : 1, int(k1 - k0)};
    const hd::Params p = fit::hqq_int_zero(x, x.n, s.bits, w.dtype, s.scale_dtype, opt);
    store_params(w, s, o, G, g, n, p, write_block(w, s, k0, k1, n, p, o.codes));
  }
};

// HQQ with fractional zero points: codes clamp(rint(x / s + z)), the scale, the zero point (float, and
// the integer code nearest to it) and Σ (x - ŵ)² with ŵ = (c - z)·s rounded to the weight type.
struct HqqFloatZeroBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  float* zero_float;  // laid out as the scales
  HqqOptions opt;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const lsq::Block x{w.data, w.dtype, w.index(k0, n), w.k_axis == 0 ? w.cols : 1, int(k1 - k0)};
    const fit::FloatZeroParams p = fit::hqq_float_zero(x, x.n, s.bits, w.dtype, s.scale_dtype, opt);
    double err = 0;
    for (int j = 0; j < x.n; ++j) {
      const float v = x[j];
      const uint8_t c = fit::quantize_float_zero(v, p, s.bits);
      o.codes[x.first + j * x.step] = c;
      const double d = double(v) - double(hd::round_to(w.dtype, fit::dequantize_float_zero(c, p)));
      err += d * d;
    }
    const int64_t pi = w.param(G, g, n);
    o.scales[pi] = p.scale;
    zero_float[pi] = p.zero;
    o.zero_points[pi] = fit::nearest_zero_code(p.zero, s.bits);
    o.block_error[g * N + n] = err;
  }
};

}  // namespace nibble::kernels::gpu

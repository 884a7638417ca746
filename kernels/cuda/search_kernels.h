// Kernel body of rtn_lsq on the device: one thread per (block g, column n), n fastest (coalesced
// reads of a [K, N] weight). It is kernels/cpu/block_fit.h's lsq_symmetric / lsq_zero_point step for
// step: the same float sums in the same order, the same double accumulations, the same candidates and
// the same tie rules, so the codes, scales and zero points are the CPU's bit for bit (checked by
// backend_check against the reference). Two differences of form, none of value: the block is read from
// the weight at each pass instead of a copied float array, and each element's importance is recomputed
// where the CPU keeps a per-thread array of it (the same float(importance(x, rms)) either way).
//
// fp64 here: the least-squares sums (as the reference), a few per candidate; the per-element work
// is float. Registers: a thread holds the block's running sums, never the block.
#pragma once
#include "kernels/cuda/rtn_kernels.h"
#include "kernels/lsq_grid.h"

namespace nibble::kernels::gpu {

namespace lsq {

enum Weight { kUniform = 0, kSquare = 1, kMagnitude = 2 };  // FitWeight's order

NIBBLE_HD inline bool finite(float x) { return x - x == 0.0f; }
NIBBLE_HD inline float copysign(float mag, float sign) {
  return hd::bits_f32((hd::f32_bits(mag) & 0x7fffffffu) | (hd::f32_bits(sign) & 0x80000000u));
}
// rint for |v| < 2^22 without a libm call (fit::fast_rint).
NIBBLE_HD inline float fast_rint(float v) {
  const float magic = 12582912.0f;
  return (v + magic) - magic;
}

// One block of a weight, read in place: element j at data[first + j * step].
struct Block {
  const void* data;
  int dtype;
  int64_t first, step;
  int n;
  NIBBLE_HD float operator[](int j) const { return hd::load(dtype, data, first + j * step); }
};

NIBBLE_HD inline double importance(int how, float x, double rms) {
  if (how == kSquare) return double(x) * double(x);
  if (how == kMagnitude) return rms + double(hd::fabs(x));
  return 1.0;
}
// fit::importance_f (the rms rounded to float)
NIBBLE_HD inline float weight_of(int how, float x, double rms) {
  if (how == kSquare) return x * x;
  if (how == kMagnitude) return float(rms) + hd::fabs(x);
  return 1.0f;
}

NIBBLE_HD inline double block_rms(const Block& x) {
  double s = 0;
  for (int k = 0; k < x.n; ++k) s += double(x[k]) * double(x[k]);
  return x.n ? sqrt(s / double(x.n)) : 0.0;
}

NIBBLE_HD inline double block_error(const Block& x, hd::Params p, int bits, bool zero_point, int t, int how,
                                    double rms) {
  double e = 0;
  for (int k = 0; k < x.n; ++k) {
    const float v = x[k];
    const float d = v - hd::round_to(t, hd::dequantize(hd::quantize(v, p, bits, zero_point, t), p, zero_point));
    e += importance(how, v, rms) * double(d) * double(d);
  }
  return e;
}

// fit::code_error: the symmetric finalists' weighted error, in float, in element order.
NIBBLE_HD inline float code_error(const Block& x, hd::Params p, int bits, int t, int how, double rms) {
  float e = 0;
  for (int k = 0; k < x.n; ++k) {
    const float v = x[k];
    const float d = v - hd::round_to(t, hd::dequantize(hd::quantize(v, p, bits, false, t), p, false));
    e += weight_of(how, v, rms) * (d * d);
  }
  return e;
}

// The block's importances, element by element (the CPU's per-thread array of them, recomputed).
struct Importances {
  const Block& x;
  int how;
  double rms;
  NIBBLE_HD float operator[](int k) const { return weight_of(how, x[k], rms); }
};

// fit::lsq_symmetric.
NIBBLE_HD inline hd::Params symmetric(const Block& x, int bits, int t, int st, int how, int steps) {
  const float nmax = float(1 << (bits - 1)), smin = hd::min_scale(st);
  float m = 0, amax = 0;
  for (int k = 0; k < x.n; ++k) {
    const float v = x[k];
    if (hd::fabs(v) > amax) amax = hd::fabs(v), m = v;
  }
  hd::Params best{smin, 0};
  if (!(amax > 0) || !finite(amax)) {
    if (!finite(amax)) best.scale = amax;
    return best;
  }
  const float s0 = hd::round_to(st, m / -nmax);
  best.scale = hd::fabs(s0) < smin ? copysign(smin, -m) : s0;
  const double rms = block_rms(x);
  const lsq_grid::Pick pick = lsq_grid::search(x, Importances{x, how, rms}, x.n, m, amax, bits, steps);
  const hd::Params p{hd::round_to(st, float(pick.lsq_scale)), 0};
  if (!pick.found || !(hd::fabs(p.scale) >= smin) || p.scale == best.scale) return best;
  return code_error(x, p, bits, t, how, rms) < code_error(x, best, bits, t, how, rms) ? p : best;
}

// fit::lsq_zero_point.
NIBBLE_HD inline hd::Params zero_point(const Block& x, int bits, int t, int st, int how, int steps) {
  const float maxq = float((1 << bits) - 1);
  float mn = 0, mx = 0;
  for (int k = 0; k < x.n; ++k) mn = hd::min(mn, x[k]), mx = hd::max(mx, x[k]);
  const hd::Params start = hd::params_zero_point(mn, mx, bits, st);
  if (!(mx > mn) || !finite(mx - mn)) return start;
  const double rms = block_rms(x);
  double sw = 0, sx = 0, sxx = 0;
  for (int k = 0; k < x.n; ++k) {
    const float v = x[k], w = weight_of(how, v, rms);
    sw += w, sx += double(w * v), sxx += double(w * v * v);
  }
  const float step = 0.1f * maxq / 15.0f;
  double fit_err = INFINITY, fit_s = 0, fit_o = 0;
  for (int i = 0; i <= 2 * steps + 2; ++i) {
    const float iscale = (maxq - 1.0f + step * float(i)) / (mx - mn);
    double sl = 0, sll = 0, sxl = 0;
    for (int k = 0; k < x.n; ++k) {
      const float v = x[k], w = weight_of(how, v, rms);
      const float l = hd::clamp(fast_rint(iscale * (v - mn)), 0.0f, maxq);
      sl += double(w * l), sll += double(w * l * l), sxl += double(w * v * l);
    }
    const double D = sw * sll - sl * sl;
    if (!(D > 0)) continue;
    double s = (sw * sxl - sx * sl) / D, off = (sll * sx - sl * sxl) / D;
    if (off > 0) off = 0, s = sxl / sll;
    const double err = sxx + s * s * sll + off * off * sw - 2 * s * sxl - 2 * off * sx + 2 * s * off * sl;
    if (s > 0 && err < fit_err) fit_err = err, fit_s = s, fit_o = off;
  }
  hd::Params p{hd::round_to(st, float(fit_s)), 0};
  if (!(p.scale >= hd::min_scale(st))) return start;
  p.zero_point = uint8_t(hd::clamp(hd::rint(float(-fit_o) / p.scale), 0.0f, maxq));
  return block_error(x, p, bits, true, t, how, rms) < block_error(x, start, bits, true, t, how, rms) ? p : start;
}

}  // namespace lsq

// rtn_lsq (search_ref.h) of one block per index.
struct RtnLsqBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  int how;    // FitWeight
  int steps;  // RtnSearchOptions::steps
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const lsq::Block x{w.data, w.dtype, w.index(k0, n), w.k_axis == 0 ? w.cols : 1, int(k1 - k0)};
    const hd::Params p = s.zero_point ? lsq::zero_point(x, s.bits, w.dtype, s.scale_dtype, how, steps)
                              : lsq::symmetric(x, s.bits, w.dtype, s.scale_dtype, how, steps);
    store_params(w, s, o, G, g, n, p, write_block(w, s, k0, k1, n, p, o.codes));
  }
};

}  // namespace nibble::kernels::gpu

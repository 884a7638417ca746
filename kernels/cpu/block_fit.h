// The per-block bodies of the calibration-free searches (rtn_lsq, hqq): one block's values in, its
// scale and zero point out. Shared by the scalar references (search_ref.cc) and the threaded CPU kernels
// (search_fast.cc), so that both give the same bits; HQQ's fit itself is kernels/hqq_fit.h, which the
// CUDA backend's kernel calls too.
//
// Whatever a search does inside, the codes are always RTN's with the chosen (scale, zero point):
// clamp(rint(w / s) + z), the arithmetic of quantize_value and of ONNX QuantizeLinear, so qdq's
// re-quantization, dq and MatMulNBits carry exactly the codes the search scored.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/hqq_fit.h"
#include "kernels/lsq_grid.h"

namespace nibble::kernels::fit {

// Importance of element x in a block whose root mean square is rms.
inline double importance(FitWeight how, float x, double rms) {
  switch (how) {
    case FitWeight::kSquare: return double(x) * double(x);
    case FitWeight::kMagnitude: return rms + std::fabs(double(x));
    default: return 1.0;
  }
}

// The weighted squared error of RTN codes under p; `t` is the weight's dtype (what dequantization
// rounds to, and what the code quotient is computed in).
inline double block_error(const float* x, int64_t n, const BlockParams& p, int bits, bool zero_point, DType t,
                          FitWeight how, double rms) {
  double e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float d =
        x[k] - round_to(t, dequantize_value(quantize_value(x[k], p, bits, zero_point, t), p, bits, zero_point));
    e += importance(how, x[k], rms) * double(d) * double(d);
  }
  return e;
}

// The weighted squared error of a symmetric block's RTN codes under p, in float, element by element
// (w·(d·d) summed in order), with w the search's float importances: the ranking of the symmetric
// search's two finalists. Float is enough to rank two scales (every term is >= 0), and a vector lane
// computes it without converting to double.
inline float code_error(const float* x, const float* w, int64_t n, const BlockParams& p, int bits, DType t) {
  float e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float d = x[k] - round_to(t, dequantize_value(quantize_value(x[k], p, bits, false, t), p, bits, false));
    e += w[k] * (d * d);
  }
  return e;
}

inline double block_rms(const float* x, int64_t n) {
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += double(x[k]) * double(x[k]);
  return n ? std::sqrt(s / double(n)) : 0.0;
}

// rint for |v| < 2^22 in the default rounding mode (half to even, as nearbyint), without a libm call,
// so the candidate loops vectorize.
inline float fast_rint(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// The importance of element x as the searches' sums weigh it: importance() in float arithmetic (rms + |x|
// from the rms rounded to float; x² is float's correctly rounded product, as the double one rounded).
inline float importance_f(FitWeight how, float x, float rms) {
  switch (how) {
    case FitWeight::kSquare: return x * x;
    case FitWeight::kMagnitude: return rms + std::fabs(x);
    default: return 1.0f;
  }
}

// The importance of every element of a block (kept per thread: blocks may be a whole channel).
inline const float* importances(const float* x, int64_t n, FitWeight how) {
  thread_local std::vector<float> w;
  w.resize(size_t(n));
  const float rms = float(block_rms(x, n));
  for (int64_t k = 0; k < n; ++k) w[size_t(k)] = importance_f(how, x[k], rms);
  return w.data();
}

// Symmetric, 2^b levels. Start from the grid that puts the block's signed extreme m on code -2^(b-1)
// (s = m / -2^(b-1), ONNX Runtime's RTN). Candidates, as llama.cpp's make_qx_quants, at inverse scales
// around -2^(b-1) / m, but on a fine grid whose every point's exact weighted RTN error comes from one
// pass over the block (kernels/lsq_grid.h). The best grid
// point's codes give the candidate: their least-squares scale Σ w·x·l / Σ w·l², which re-rounding can
// only improve on (RTN's codes are each element's nearest at that scale), so it is never worse than the
// grid point's own scale before both are rounded to the scale type. The candidate is rounded to the scale
// type, scored by code_error on RTN codes (the codes written) and kept where it lowers the start's error.
inline BlockParams lsq_symmetric(const float* x, int64_t n, int bits, DType t, DType st, const RtnSearchOptions& o) {
  const float nmax = float(1 << (bits - 1));
  float m = 0, amax = 0;
  for (int64_t k = 0; k < n; ++k)
    if (std::fabs(x[k]) > amax) amax = std::fabs(x[k]), m = x[k];
  BlockParams best;
  best.scale = min_scale(st);
  if (!(amax > 0) || !std::isfinite(amax)) {
    if (!std::isfinite(amax)) best.scale = amax;  // NaN/Inf in the weight: the caller reports it
    return best;
  }
  const float s0 = round_to(st, m / -nmax);
  best.scale = std::fabs(s0) < min_scale(st) ? std::copysign(min_scale(st), -m) : s0;
  const float* w = importances(x, n, o.weight);
  const lsq_grid::Pick pick = lsq_grid::search(x, w, int(n), m, amax, bits, o.steps);
  BlockParams p;
  p.scale = round_to(st, float(pick.lsq_scale));
  // A candidate equal to the start would score the start's error again, not below it.
  if (!pick.found || !(std::fabs(p.scale) >= min_scale(st)) || p.scale == best.scale) return best;
  return code_error(x, w, n, p, bits, t) < code_error(x, w, n, best, bits, t) ? p : best;
}

// Zero point, 2^b levels over [min(x, 0), max(x, 0)] (0 stays on the grid, as an integer zero point
// needs). Start from plain min/max RTN. Then, as llama.cpp's make_qkx2_quants: for inverse scales
// (2^b - 2 + ε_i) / (max - min) round the block from its minimum to l, fit x ≈ s·l + o by weighted
// least squares (o ≤ 0) and take the candidate with the smallest fitted error; z = clamp(rint(-o / s)),
// s rounded to the scale type, re-round the block (RTN codes) and keep it if its weighted error is
// smaller than the start's.
inline BlockParams lsq_zero_point(const float* x, int64_t n, int bits, DType t, DType st, const RtnSearchOptions& o) {
  const float maxq = float((1 << bits) - 1);
  float mn = 0, mx = 0;
  for (int64_t k = 0; k < n; ++k) mn = std::min(mn, x[k]), mx = std::max(mx, x[k]);
  const BlockParams start = block_params_zero_point(mn, mx, bits, st);
  if (!(mx > mn) || !std::isfinite(mx - mn)) return start;
  const float* w = importances(x, n, o.weight);
  double sw = 0, sx = 0, sxx = 0;
  for (int64_t k = 0; k < n; ++k) sw += w[k], sx += double(w[k] * x[k]), sxx += double(w[k] * x[k] * x[k]);
  const float step = 0.1f * maxq / 15.0f;
  double fit_err = INFINITY, fit_s = 0, fit_o = 0;
  for (int i = 0; i <= 2 * o.steps + 2; ++i) {
    const float iscale = (maxq - 1.0f + step * float(i)) / (mx - mn);
    double sl = 0, sll = 0, sxl = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float l = std::clamp(fast_rint(iscale * (x[k] - mn)), 0.0f, maxq);
      sl += double(w[k] * l), sll += double(w[k] * l * l), sxl += double(w[k] * x[k] * l);
    }
    const double D = sw * sll - sl * sl;
    if (!(D > 0)) continue;
    double s = (sw * sxl - sx * sl) / D, off = (sll * sx - sl * sxl) / D;
    if (off > 0) off = 0, s = sxl / sll;
    // Σ w (x - s·l - o)², expanded
    const double err = sxx + s * s * sll + off * off * sw - 2 * s * sxl - 2 * off * sx + 2 * s * off * sl;
    if (s > 0 && err < fit_err) fit_err = err, fit_s = s, fit_o = off;
  }
  BlockParams p;
  p.scale = round_to(st, float(fit_s));
  if (!(p.scale >= min_scale(st))) return start;
  p.zero_point = uint8_t(std::clamp(std::nearbyint(float(-fit_o) / p.scale), 0.0f, maxq));
  const double rms = block_rms(x, n);
  return block_error(x, n, p, bits, true, t, o.weight, rms) < block_error(x, n, start, bits, true, t, o.weight, rms)
             ? p
             : start;
}

// The rtn_lsq search of one block: symmetric, or with a zero point.
inline BlockParams lsq_block(const float* x, int64_t n, bool zero_point, int bits, DType t, DType st,
                             const RtnSearchOptions& o) {
  return zero_point ? lsq_zero_point(x, n, bits, t, st, o) : lsq_symmetric(x, n, bits, t, st, o);
}

// HQQ (kernels/hqq_fit.h, the one source the CUDA backend runs too) on a gathered block, in the CPU's
// parameter types.
inline BlockParams hqq_block(const float* x, int64_t n, int bits, DType t, DType st, const HqqOptions& o) {
  const hd::Params p = hqq_int_zero(x, n, bits, int(t), int(st), o);
  BlockParams b;
  b.scale = p.scale;
  b.zero_point = p.zero_point;
  return b;
}
inline FloatZeroParams hqq_block_float(const float* x, int64_t n, int bits, DType t, DType st, const HqqOptions& o) {
  return hqq_float_zero(x, n, bits, int(t), int(st), o);
}

// Calls drive(fit) with the block fit `o` selects: hqq_block (integer zero points, BlockParams) or
// hqq_block_float (FloatZeroParams). drive is the per-block loop (search_ref.cc's serial one, or
// search_fast.cc's parallel one); both instantiate it for either parameter type.
template <class Drive>
void with_hqq_fit(int bits, DType t, DType st, const HqqOptions& o, const Drive& drive) {
  if (o.float_zero_point)
    drive([&](const float* x, int64_t n) { return hqq_block_float(x, n, bits, t, st, o); });
  else
    drive([&](const float* x, int64_t n) { return hqq_block(x, n, bits, t, st, o); });
}

// What the per-block drivers (search_ref.cc, search_fast.cc) do with a block's parameters, for either
// kind: its codes, the value a code stands for, and where the parameters go in the result.
inline uint8_t code_of(float x, const BlockParams& p, int bits, bool zero_point, DType t) {
  return quantize_value(x, p, bits, zero_point, t);
}
inline uint8_t code_of(float x, const FloatZeroParams& p, int bits, bool, DType) { return quantize_float_zero(x, p, bits); }
inline float value_of(uint8_t c, const BlockParams& p, int bits, bool zero_point) {
  return dequantize_value(c, p, bits, zero_point);
}
inline float value_of(uint8_t c, const FloatZeroParams& p, int, bool) { return dequantize_float_zero(c, p); }
inline void store_params(QuantResult& out, size_t i, const BlockParams& p, bool zero_point, int) {
  out.scales[i] = p.scale;
  if (zero_point) out.zero_points[i] = p.zero_point;
}
inline void store_params(QuantResult& out, size_t i, const FloatZeroParams& p, bool, int bits) {
  out.scales[i] = p.scale;
  out.float_zero_points[i] = p.zero;
  out.zero_points[i] = nearest_zero_code(p.zero, bits);
}
// Sizes the result's parameter arrays for G x N blocks of parameters P.
template <class P>
void size_params(QuantResult& out, int64_t GN, bool zero_point) {
  constexpr bool kFloat = std::is_same_v<P, FloatZeroParams>;  // zero_points then hold rint(z), clamped
  out.scales.assign(size_t(GN), 0.0f);
  out.zero_points.assign(zero_point ? size_t(GN) : 0, 0);
  out.float_zero_points.assign(kFloat ? size_t(GN) : 0, 0.0f);
}

}  // namespace nibble::kernels::fit

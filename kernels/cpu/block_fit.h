// The per-block bodies of the calibration-free searches (rtn_lsq, hqq): one block's values in, its
// scale and zero point out. Shared by the scalar references (search_ref.cc), the threaded CPU kernels
// (search_fast.cc) and, through the host, the CUDA backend, so that all give the same bits.
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
inline double block_error(const float* x, int64_t n, const BlockParams& p, int bits, bool zp, DType t,
                          FitWeight how, double rms) {
  double e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float d = x[k] - round_to(t, dequantize_value(quantize_value(x[k], p, bits, zp, t), p, bits, zp));
    e += importance(how, x[k], rms) * double(d) * double(d);
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

// The importance of every element of a block (kept per thread: blocks may be a whole channel).
inline const float* importances(const float* x, int64_t n, FitWeight how) {
  thread_local std::vector<float> w;
  w.resize(size_t(n));
  const double rms = block_rms(x, n);
  for (int64_t k = 0; k < n; ++k) w[size_t(k)] = float(importance(how, x[k], rms));
  return w.data();
}

// Sums over kLanes float lanes: loops of this shape vectorize without reassociating flags, and every
// ISA copy adds the same numbers in the same order.
constexpr int kLanes = 8;

// Symmetric codes l = clamp(rint(iscale·x), lo, hi) and their weighted least-squares scale
// s = Σ w·x·l / Σ w·l² (0 when every code is 0).
inline double lsq_scale_at(const float* x, const float* w, int64_t n, float iscale, float lo, float hi) {
  float sxl[kLanes] = {}, sll[kLanes] = {};
  auto add = [&](int64_t k, int j) {
    const float l = std::clamp(fast_rint(iscale * x[k]), lo, hi);
    sxl[j] += w[k] * x[k] * l;
    sll[j] += w[k] * l * l;
  };
  int64_t k0 = 0;
  for (; k0 + kLanes <= n; k0 += kLanes)
    for (int j = 0; j < kLanes; ++j) add(k0 + j, j);
  for (int j = 0; k0 + j < n; ++j) add(k0 + j, j);
  double a = 0, b = 0;
  for (int j = 0; j < kLanes; ++j) a += sxl[j], b += sll[j];
  return b > 0 ? a / b : 0.0;
}

// The weighted squared error of symmetric RTN at scale s in float arithmetic: it ranks the candidates
// (the dtype's own rounding is left to block_error, which makes the final choice).
inline double sym_error_at(const float* x, const float* w, int64_t n, float s, float lo, float hi) {
  float e[kLanes] = {};
  auto add = [&](int64_t k, int j) {
    const float d = x[k] - std::clamp(fast_rint(x[k] / s), lo, hi) * s;
    e[j] += w[k] * d * d;
  };
  int64_t k0 = 0;
  for (; k0 + kLanes <= n; k0 += kLanes)
    for (int j = 0; j < kLanes; ++j) add(k0 + j, j);
  for (int j = 0; k0 + j < n; ++j) add(k0 + j, j);
  double t = 0;
  for (int j = 0; j < kLanes; ++j) t += e[j];
  return t;
}

// Symmetric, 2^b levels. Start from the grid that puts the block's signed extreme m on code -2^(b-1)
// (s = m / -2^(b-1), ONNX Runtime's RTN). Candidates, as llama.cpp's make_qx_quants: for inverse
// scales around -2^(b-1) / m, and (the other sign) around (2^(b-1) - 1) / m, round the block to l and
// fit s = Σ w·x·l / Σ w·l² (weighted least squares). The candidate whose fitted scale gives the
// smallest weighted error is tried, then the best so far is refined: re-fit on its codes while the error
// falls.
// Every scale is rounded to the scale type and scored by block_error on RTN codes, the codes written.
inline BlockParams lsq_symmetric(const float* x, int64_t n, int bits, DType t, DType st, const RtnSearchOptions& o) {
  const float nmax = float(1 << (bits - 1)), lo = -nmax, hi = nmax - 1.0f;
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
  const double rms = block_rms(x, n);
  double best_err = block_error(x, n, best, bits, false, t, o.weight, rms);
  auto usable = [&](double sc) { return std::fabs(round_to(st, float(sc))) >= min_scale(st); };
  const float step = 0.1f * nmax / 8.0f;  // llama.cpp's 0.1 of 8 levels, the same relative step at 8 bits
  double cand = 0, cand_err = INFINITY;
  for (const float edge : {-nmax, hi})
    for (int i = -o.steps; i <= o.steps; ++i) {
      const float iscale = (edge + std::copysign(step, edge) * float(i)) / m;
      const double sc = lsq_scale_at(x, w, n, iscale, lo, hi);
      if (!usable(sc)) continue;
      const double e = sym_error_at(x, w, n, round_to(st, float(sc)), lo, hi);
      if (e < cand_err) cand_err = e, cand = sc;
    }
  auto consider = [&](double sc) {
    if (!usable(sc)) return false;
    BlockParams p;
    p.scale = round_to(st, float(sc));
    const double e = block_error(x, n, p, bits, false, t, o.weight, rms);
    if (!(e < best_err)) return false;
    best_err = e, best = p;
    return true;
  };
  consider(cand);
  for (int it = 0; it < 8 && consider(lsq_scale_at(x, w, n, 1.0f / best.scale, lo, hi)); ++it) {
  }
  return best;
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

// Half-quadratic quantization (Badri & Shaji 2023; the proximal iterations of mobiusml's
// optimize_weights_proximal as ONNX Runtime's HQQ quantizer runs them, float32): with the inverse scale
// fixed at is = (2^b - 1) / (max - min), the zero point z alternates with the sparse error e of an lp
// (p < 1) norm: W_q = clamp(rint(x·is + z)), e = shrink_p(x - W_q/is + z/is), z = mean(W_q - (x - e)·is),
// β *= κ, stopping when the mean |x - Ŵ| stops falling. [mn, mx] is the block's range; z starts at
// rint(-mn·is). Returns the last update of z (ONNX Runtime's, computed from the iteration that did not
// improve), or with keep_best the z of the smallest mean |x - Ŵ| seen; sets *is_out.
inline float hqq_zero(const float* x, int64_t n, float mn, float mx, int bits, const HqqOptions& o, bool keep_best,
                      float* is_out) {
  const float maxq = float((1 << bits) - 1);
  const float is = std::min(maxq / (mx > mn ? mx - mn : maxq), 2e4f);
  float z = std::nearbyint(-mn * is), beta = o.beta;
  float best = 1e4f, zbest = z;
  for (int it = 0; it < o.iters; ++it) {
    double zsum = 0, esum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float q = std::clamp(std::nearbyint(x[k] * is + z), 0.0f, maxq);
      const float r = x[k] - (q - z) / is;
      const float ar = std::fabs(r);
      const float shrunk = std::max(ar - (1.0f / beta) * std::pow(ar + 1e-8f, o.lp_norm - 1.0f), 0.0f);
      const float e = std::copysign(shrunk, r);
      zsum += double(q - (x[k] - e) * is);
      esum += double(ar);
    }
    const float znew = float(zsum / double(n));
    beta *= o.kappa;
    const float err = float(esum / double(n));
    if (err < best) {
      best = err, zbest = z, z = znew;
    } else {
      z = znew;
      break;
    }
  }
  if (keep_best) z = zbest;
  *is_out = is;
  return z;
}

// HQQ with an integer zero point (what ONNX DequantizeLinear needs): the range includes 0 so that
// rint(z) stays on the grid, z is rounded and clamped, the scale 1/is rounded to the scale type;
// refit_scale then re-fits the scale by least squares on the final codes and keeps it when the block's
// squared error falls.
inline BlockParams hqq_block(const float* x, int64_t n, int bits, DType t, DType st, const HqqOptions& o) {
  const float maxq = float((1 << bits) - 1);
  float mn = 0, mx = 0;
  for (int64_t k = 0; k < n; ++k) mn = std::min(mn, x[k]), mx = std::max(mx, x[k]);
  if (!(mx > mn) || !std::isfinite(mx - mn)) return block_params_zero_point(mn, mx, bits, st);
  float is = 0;
  const float z = hqq_zero(x, n, mn, mx, bits, o, false, &is);
  BlockParams p;
  p.scale = std::max(round_to(st, 1.0f / is), min_scale(st));
  p.zero_point = uint8_t(std::clamp(std::nearbyint(z), 0.0f, maxq));
  if (!o.refit_scale) return p;
  double sxl = 0, sll = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double l = double(quantize_value(x[k], p, bits, true, t)) - double(p.zero_point);
    sxl += double(x[k]) * l, sll += l * l;
  }
  if (!(sll > 0)) return p;
  BlockParams r = p;
  r.scale = round_to(st, float(sxl / sll));
  if (!(r.scale >= min_scale(st))) return p;
  const double rms = 0;
  return block_error(x, n, r, bits, true, t, FitWeight::kUniform, rms) <
                 block_error(x, n, p, bits, true, t, FitWeight::kUniform, rms)
             ? r
             : p;
}

// A block with a fractional zero point (com.microsoft.MatMulNBits' float zero points): ŵ = (q - z)·s.
struct FloatZeroParams {
  float scale = 1.0f;
  float zero = 0.0f;
};

// The nearest code to x under p: clamp(rint(x / s + z)), in float32 (no QuantizeLinear re-derives it).
inline uint8_t quantize_float_zero(float x, const FloatZeroParams& p, int bits) {
  return uint8_t(std::clamp(std::nearbyint(x / p.scale + p.zero), 0.0f, float((1 << bits) - 1)));
}

inline float dequantize_float_zero(uint8_t code, const FloatZeroParams& p) { return (float(code) - p.zero) * p.scale; }

inline double float_zero_error(const float* x, int64_t n, const FloatZeroParams& p, int bits, DType t) {
  double e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double d = double(x[k]) - double(round_to(t, dequantize_float_zero(quantize_float_zero(x[k], p, bits), p)));
    e += d * d;
  }
  return e;
}

// Least squares x ≈ s·q + c on the codes of p (then z = -c / s), both rounded to the scale type; p when
// the fit is degenerate or does not lower the block's squared error.
inline FloatZeroParams refit_float_zero(const float* x, int64_t n, const FloatZeroParams& p, int bits, DType t,
                                        DType st) {
  double sq = 0, sqq = 0, sx = 0, sxq = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double q = double(quantize_float_zero(x[k], p, bits));
    sq += q, sqq += q * q, sx += double(x[k]), sxq += double(x[k]) * q;
  }
  const double D = double(n) * sqq - sq * sq;
  if (!(D > 0)) return p;
  const double s = (double(n) * sxq - sq * sx) / D, c = (sx - s * sq) / double(n);
  FloatZeroParams r;
  r.scale = round_to(st, float(s));
  if (!(r.scale >= min_scale(st))) return p;
  r.zero = round_to(st, float(-c / double(r.scale)));
  if (!std::isfinite(r.zero)) return p;
  return float_zero_error(x, n, r, bits, t) < float_zero_error(x, n, p, bits, t) ? r : p;
}

// HQQ with the fractional zero point kept, as ONNX Runtime's HQQ writes it: the block's own [min, max]
// (0 need not be on the grid), s = 1/is and z rounded to the scale type (the type MatMulNBits stores
// them in), so the codes computed from them are what MatMulNBits dequantizes. Unlike ONNX Runtime, z is
// the best iterate, not the one after it (SmolLM2-135M: KL 0.339 against 0.341 fp32, 0.342 against
// 0.348 fp16). refit_scale refits s and z jointly by least squares on the final codes, kept when the
// block's squared error falls (lower weight error, but a worse perplexity there: off by default).
inline FloatZeroParams hqq_block_float(const float* x, int64_t n, int bits, DType t, DType st, const HqqOptions& o) {
  float mn = n ? x[0] : 0.0f, mx = mn;
  for (int64_t k = 0; k < n; ++k) mn = std::min(mn, x[k]), mx = std::max(mx, x[k]);
  FloatZeroParams p;
  if (!std::isfinite(mx - mn)) {
    p.scale = mx - mn;  // NaN/Inf in the weight: the caller reports it
    return p;
  }
  // Min/max RTN over [min(mn, 0), max(mx, 0)] (0 on the grid, an integer zero point): for a constant block,
  // where it puts the value on a level, and for a z past the float type's range (a narrow block far from 0).
  const auto min_max = [&] {
    const BlockParams b = block_params_zero_point(std::min(mn, 0.0f), std::max(mx, 0.0f), bits, st);
    return FloatZeroParams{b.scale, float(b.zero_point)};
  };
  if (!(mx > mn)) return min_max();
  float is = 0;
  const float z = hqq_zero(x, n, mn, mx, bits, o, true, &is);
  p.scale = std::max(round_to(st, 1.0f / is), min_scale(st));
  p.zero = round_to(st, z);
  if (!std::isfinite(p.zero)) return min_max();
  return o.refit_scale ? refit_float_zero(x, n, p, bits, t, st) : p;
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
inline uint8_t code_of(float x, const BlockParams& p, int bits, bool zp, DType t) {
  return quantize_value(x, p, bits, zp, t);
}
inline uint8_t code_of(float x, const FloatZeroParams& p, int bits, bool, DType) { return quantize_float_zero(x, p, bits); }
inline float value_of(uint8_t c, const BlockParams& p, int bits, bool zp) { return dequantize_value(c, p, bits, zp); }
inline float value_of(uint8_t c, const FloatZeroParams& p, int, bool) { return dequantize_float_zero(c, p); }
inline void store_params(QuantResult& out, size_t i, const BlockParams& p, bool zp, int) {
  out.scales[i] = p.scale;
  if (zp) out.zero_points[i] = p.zero_point;
}
inline void store_params(QuantResult& out, size_t i, const FloatZeroParams& p, bool, int bits) {
  out.scales[i] = p.scale;
  out.zero_points_float[i] = p.zero;
  out.zero_points[i] = uint8_t(std::clamp(std::nearbyint(p.zero), 0.0f, float((1 << bits) - 1)));
}
// Sizes the result's parameter arrays for G x N blocks of parameters P.
template <class P>
void size_params(QuantResult& out, int64_t GN, bool zp) {
  constexpr bool kFloat = std::is_same_v<P, FloatZeroParams>;  // zero_points then hold rint(z), clamped
  out.scales.assign(size_t(GN), 0.0f);
  out.zero_points.assign(zp ? size_t(GN) : 0, 0);
  out.zero_points_float.assign(kFloat ? size_t(GN) : 0, 0.0f);
}

}  // namespace nibble::kernels::fit

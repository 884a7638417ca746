// HQQ's per-block fit, one source for every backend: the CPU reference and the threaded CPU kernels
// (through kernels/cpu/block_fit.h, on a gathered float array) and the CUDA backend's kernel body
// (kernels/cuda/hqq_kernels.h, on the block read in place from device memory) call these very
// functions, NIBBLE_HD, so all give the same bits. `X` is the block: anything with x[k] -> float.
// Only IEEE arithmetic and the shared helpers (hd_float.h, hd_pow.h): no libm call whose bits could
// differ between a host's libm and a GPU's.
//
// The codes are always RTN's with the chosen scale and zero point (clamp(rint(w / s) + z)), so qdq's
// re-quantization, dq and MatMulNBits carry exactly the codes the fit scored.
#pragma once
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/hd_float.h"
#include "kernels/hd_pow.h"

namespace nibble::kernels::fit {

namespace hqq_detail {
NIBBLE_HD inline bool finite(float v) { return v - v == 0.0f; }
NIBBLE_HD inline float copysign(float mag, float sign) {
  return hd::bits_f32((hd::f32_bits(mag) & 0x7fffffffu) | (hd::f32_bits(sign) & 0x80000000u));
}
}  // namespace hqq_detail

// The shrinkage of HQQ's proximal step, max(|r| - c·(|r| + 1e-8)^p1, 0) with c = 1/β, in float.
NIBBLE_HD inline float hqq_shrink(float ar, float c, float p1) {
  return hd::max(ar - c * pow_nonneg(ar + 1e-8f, p1), 0.0f);
}

// A float A such that hqq_shrink(a, c, p1) is +0 for every a in [0, A] (-1 when none is found). The
// power falls as a grows when p1 < 0 (the double behind pow_nonneg is within 4e-15 of x^p1, far closer
// than adjacent floats' powers differ once |p1| ≥ 1/64, and every rounding after it is monotone), so
// c·(a + 1e-8)^p1 ≥ c·(A + 1e-8)^p1 ≥ A ≥ a: checking A itself, with the very expression of the
// shrinkage, proves the rest. Below A the power need not be computed, and HQQ's residuals nearly all lie
// there (c·a^p1 = a at a ≈ 0.17 for β = 10, p = 0.7, and a residual is about its block's scale: on
// SmolLM2-135M's 4-bit blocks of 128, 1 in 90 000 is above).
NIBBLE_HD inline float hqq_no_shrink_below(float c, float p1) {
  if (!(p1 <= -0.015625f)) return -1.0f;
  const float a = 0.99f * pow_nonneg(c, 1.0f / (1.0f - p1));  // c·a^p1 = a, less 1%
  return a < INFINITY && hqq_shrink(a, c, p1) == 0.0f ? a : -1.0f;
}

// Half-quadratic quantization (Badri & Shaji 2023; the proximal iterations of mobiusml's
// optimize_weights_proximal as ONNX Runtime's HQQ quantizer runs them, float32): with the inverse scale
// fixed at is = (2^b - 1) / (max - min), the zero point z alternates with the sparse error e of an lp
// (p < 1) norm: W_q = clamp(rint(x·is + z)), e = shrink_p(x - W_q/is + z/is), z = mean(W_q - (x - e)·is),
// β *= κ, stopping when the mean |x - Ŵ| stops falling. [mn, mx] is the block's range; z starts at
// rint(-mn·is). Returns the last update of z (ONNX Runtime's, computed from the iteration that did not
// improve), or with keep_best the z of the smallest mean |x - Ŵ| seen; sets *is_out. The power
// |r|^(p-1) is nibble's own (hd_pow.h), not libm's powf: it is the correctly rounded value but on rare
// near-ties, where powf may differ by an ulp. It is computed only above hqq_no_shrink_below's threshold,
// where the shrinkage can be non-zero (the same values, far fewer powers).
template <class X>
NIBBLE_HD float hqq_zero(const X& x, int64_t n, float mn, float mx, int bits, const HqqOptions& o, bool keep_best,
                         float* is_out) {
  const float maxq = float((1 << bits) - 1);
  const float is = hd::min(maxq / (mx > mn ? mx - mn : maxq), 2e4f);
  const float p1 = o.lp_norm - 1.0f;
  float z = hd::rint(-mn * is), beta = o.beta;
  float best = 1e4f, zbest = z;
  for (int it = 0; it < o.iters; ++it) {
    double zsum = 0, esum = 0;
    const float c = 1.0f / beta, none_below = hqq_no_shrink_below(c, p1);
    for (int64_t k = 0; k < n; ++k) {
      const float v = x[k];
      const float q = hd::clamp(hd::rint(v * is + z), 0.0f, maxq);
      const float r = v - (q - z) / is;
      const float ar = hd::fabs(r);
      const float shrunk = ar <= none_below ? 0.0f : hqq_shrink(ar, c, p1);
      const float e = hqq_detail::copysign(shrunk, r);
      zsum += double(q - (v - e) * is);
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

// Σ (x - ŵ)² of RTN codes under p with a zero point, ŵ rounded to the weight type t.
template <class X>
NIBBLE_HD double zero_point_error(const X& x, int64_t n, hd::Params p, int bits, int t) {
  double e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k];
    const float d = v - hd::round_to(t, hd::dequantize(hd::quantize(v, p, bits, true, t), p, true));
    e += double(d) * double(d);
  }
  return e;
}

// HQQ with an integer zero point (what ONNX DequantizeLinear needs): the range includes 0 so that
// rint(z) stays on the grid, z is rounded and clamped, the scale 1/is rounded to the scale type st;
// refit_scale then re-fits the scale by least squares on the final codes and keeps it when the block's
// squared error falls. t is the weight's type (what the code quotient and ŵ are rounded to).
template <class X>
NIBBLE_HD hd::Params hqq_int_zero(const X& x, int64_t n, int bits, int t, int st, const HqqOptions& o) {
  const float maxq = float((1 << bits) - 1);
  float mn = 0, mx = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k];
    mn = hd::min(mn, v), mx = hd::max(mx, v);
  }
  if (!(mx > mn) || !hqq_detail::finite(mx - mn)) return hd::params_zero_point(mn, mx, bits, st);
  float is = 0;
  const float z = hqq_zero(x, n, mn, mx, bits, o, false, &is);
  hd::Params p{hd::max(hd::round_to(st, 1.0f / is), hd::min_scale(st)), uint8_t(hd::clamp(hd::rint(z), 0.0f, maxq))};
  if (!o.refit_scale) return p;
  double sxl = 0, sll = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k];
    const double l = double(hd::quantize(v, p, bits, true, t)) - double(p.zero_point);
    sxl += double(v) * l, sll += l * l;
  }
  if (!(sll > 0)) return p;
  hd::Params r = p;
  r.scale = hd::round_to(st, float(sxl / sll));
  if (!(r.scale >= hd::min_scale(st))) return p;
  return zero_point_error(x, n, r, bits, t) < zero_point_error(x, n, p, bits, t) ? r : p;
}

// A block with a fractional zero point (com.microsoft.MatMulNBits' float zero points): ŵ = (q - z)·s.
struct FloatZeroParams {
  float scale = 1.0f;
  float zero = 0.0f;
};

// The nearest code to x under p: clamp(rint(x / s + z)), in float32 (no QuantizeLinear re-derives it).
NIBBLE_HD inline uint8_t quantize_float_zero(float x, const FloatZeroParams& p, int bits) {
  return uint8_t(hd::clamp(hd::rint(x / p.scale + p.zero), 0.0f, float((1 << bits) - 1)));
}

NIBBLE_HD inline float dequantize_float_zero(uint8_t code, const FloatZeroParams& p) {
  return (float(code) - p.zero) * p.scale;
}

// The integer code nearest to a fractional zero point (what padding in a packed layout carries).
NIBBLE_HD inline uint8_t nearest_zero_code(float z, int bits) {
  return uint8_t(hd::clamp(hd::rint(z), 0.0f, float((1 << bits) - 1)));
}

template <class X>
NIBBLE_HD double float_zero_error(const X& x, int64_t n, const FloatZeroParams& p, int bits, int t) {
  double e = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k];
    const double d = double(v) - double(hd::round_to(t, dequantize_float_zero(quantize_float_zero(v, p, bits), p)));
    e += d * d;
  }
  return e;
}

// Least squares x ≈ s·q + c on the codes of p (then z = -c / s), both rounded to the scale type; p when
// the fit is degenerate or does not lower the block's squared error.
template <class X>
NIBBLE_HD FloatZeroParams refit_float_zero(const X& x, int64_t n, const FloatZeroParams& p, int bits, int t, int st) {
  double sq = 0, sqq = 0, sx = 0, sxq = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k];
    const double q = double(quantize_float_zero(v, p, bits));
    sq += q, sqq += q * q, sx += double(v), sxq += double(v) * q;
  }
  const double D = double(n) * sqq - sq * sq;
  if (!(D > 0)) return p;
  const double s = (double(n) * sxq - sq * sx) / D, c = (sx - s * sq) / double(n);
  FloatZeroParams r;
  r.scale = hd::round_to(st, float(s));
  if (!(r.scale >= hd::min_scale(st))) return p;
  r.zero = hd::round_to(st, float(-c / double(r.scale)));
  if (!hqq_detail::finite(r.zero)) return p;
  return float_zero_error(x, n, r, bits, t) < float_zero_error(x, n, p, bits, t) ? r : p;
}

// Min/max RTN over [min(mn, 0), max(mx, 0)] (0 on the grid, an integer zero point) as float parameters.
NIBBLE_HD inline FloatZeroParams float_zero_min_max(float mn, float mx, int bits, int st) {
  const hd::Params b = hd::params_zero_point(hd::min(mn, 0.0f), hd::max(mx, 0.0f), bits, st);
  return FloatZeroParams{b.scale, float(b.zero_point)};
}

// HQQ with the fractional zero point kept, as ONNX Runtime's HQQ writes it: the block's own [min, max]
// (0 need not be on the grid), s = 1/is and z rounded to the scale type (the type MatMulNBits stores
// them in), so the codes computed from them are what MatMulNBits dequantizes. Unlike ONNX Runtime, z is
// the best iterate, not the one after it (SmolLM2-135M: KL 0.339 against 0.341 fp32, 0.342 against
// 0.348 fp16). refit_scale refits s and z jointly by least squares on the final codes, kept when the
// block's squared error falls (lower weight error, but a worse perplexity there: off by default).
// Min/max RTN stands in for a constant block, where it puts the value on a level, and for a z past the
// float type's range (a narrow block far from 0).
template <class X>
NIBBLE_HD FloatZeroParams hqq_float_zero(const X& x, int64_t n, int bits, int t, int st, const HqqOptions& o) {
  float mn = n ? x[0] : 0.0f, mx = mn;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k];
    mn = hd::min(mn, v), mx = hd::max(mx, v);
  }
  FloatZeroParams p;
  if (!hqq_detail::finite(mx - mn)) {
    p.scale = mx - mn;  // NaN/Inf in the weight: the caller reports it
    return p;
  }
  if (!(mx > mn)) return float_zero_min_max(mn, mx, bits, st);
  float is = 0;
  const float z = hqq_zero(x, n, mn, mx, bits, o, true, &is);
  p.scale = hd::max(hd::round_to(st, 1.0f / is), hd::min_scale(st));
  p.zero = hd::round_to(st, z);
  if (!hqq_detail::finite(p.zero)) return float_zero_min_max(mn, mx, bits, st);
  return o.refit_scale ? refit_float_zero(x, n, p, bits, t, st) : p;
}

}  // namespace nibble::kernels::fit

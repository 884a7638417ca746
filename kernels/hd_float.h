// The scalar arithmetic every CUDA kernel body shares, callable from host and device (NIBBLE_HD):
// fp16/bf16 rounding (kernels/half_float.h), round-half-even and ModelOpt's block formulas, which the CPU
// reference calls too (kernels/cpu/rtn_ref.h, kernels/clip_candidate.h). Here, beside the interface, so that
// code both backends run (kernels/hqq_fit.h) can use it. nvcc builds it with --fmad=false and
// g++ with -ffp-contract=off, so no product is fused into an add on either side.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/half_float.h"

namespace nibble::kernels::hd {

// Element types, as DType's numbers (kernels/dtype.h); plain ints so device code needs no host header.
constexpr int kF32 = 1, kF16 = 10, kBF16 = 16;

// The conversions are the ones every backend shares (kernels/half_float.h).
using ::nibble::bf16_to_float;
using ::nibble::bits_f32;
using ::nibble::f32_bits;
using ::nibble::float_to_bf16;
using ::nibble::float_to_half;
using ::nibble::half_to_float;

// Round half to even in the current (default, to nearest) mode, as std::nearbyint.
NIBBLE_HD inline float rint(float x) {
#ifdef __CUDA_ARCH__
  return rintf(x);
#else
  // Inline rather than libm's call (it sits in per-element loops): below 2^23 adding and taking away 2^23
  // rounds to an integer, half to even, in the default mode; larger values, inf and NaN are integers or
  // pass as they are; the sign restores -0 for negative values that round to zero, as nearbyint does.
  const float a = bits_f32(f32_bits(x) & 0x7fffffffu);
  if (!(a < 8388608.0f)) return x;
  const float r = (a + 8388608.0f) - 8388608.0f;
  return bits_f32(f32_bits(r) | (f32_bits(x) & 0x80000000u));
#endif
}
NIBBLE_HD inline float fabs(float x) { return bits_f32(f32_bits(x) & 0x7fffffffu); }
NIBBLE_HD inline float trunc(float x) {
#ifdef __CUDA_ARCH__
  return truncf(x);
#else
  return std::trunc(x);
#endif
}
// C's roundf: halves away from zero. x - trunc(x) is exact in float, so the test of the half is too.
NIBBLE_HD inline float round_half_away(float x) {
  const float t = trunc(x);
  return fabs(x - t) >= 0.5f ? t + (x < 0.0f ? -1.0f : 1.0f) : t;
}
NIBBLE_HD inline bool isnan(float x) { return x != x; }
// std::min / std::max / std::clamp exactly (which argument wins on ties and NaN matters for bits).
NIBBLE_HD inline float min(float a, float b) { return b < a ? b : a; }
NIBBLE_HD inline float max(float a, float b) { return a < b ? b : a; }
NIBBLE_HD inline float clamp(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

NIBBLE_HD inline float round_to(int t, float f) {
  if (t == kF16) return ::nibble::round_to_half(f);
  if (t == kBF16) return ::nibble::round_to_bf16(f);
  return f;
}
NIBBLE_HD inline float load(int t, const void* p, int64_t i) {
  if (t == kF32) return static_cast<const float*>(p)[i];
  const uint16_t v = static_cast<const uint16_t*>(p)[i];
  return t == kF16 ? half_to_float(v) : bf16_to_float(v);
}
NIBBLE_HD inline void store(int t, void* p, int64_t i, float f) {
  if (t == kF32) static_cast<float*>(p)[i] = f;
  else static_cast<uint16_t*>(p)[i] = t == kF16 ? float_to_half(f) : float_to_bf16(f);
}

// ---- ModelOpt's block formulas, the definition (rtn_ref.h's block_params_* call these).
struct Params {
  float scale;
  uint8_t zero_point;
};
NIBBLE_HD inline float min_scale(int t) { return round_to(t, 1e-5f); }
NIBBLE_HD inline Params params_symmetric(float amax, int bits, int t) {
  const float qmax = float((1 << (bits - 1)) - 1);
  return Params{max(round_to(t, amax / qmax), min_scale(t)), 0};
}
NIBBLE_HD inline Params params_zero_point(float mn, float mx, int bits, int t) {
  const float maxq = float((1 << bits) - 1);
  const float range = max(round_to(t, mx - mn), min_scale(t));
  Params p{round_to(t, range / maxq), 0};
  const float z = -rint(round_to(t, mn / p.scale));
  p.zero_point = uint8_t(clamp(z, 0.0f, maxq));
  return p;
}
// numpy divides fp16 arrays in fp32 and rounds the quotient to fp16; bf16 codes stay in fp32.
NIBBLE_HD inline uint8_t quantize(float w, Params p, int bits, bool zero_point, int t) {
  float q = w / p.scale;
  if (t == kF16) q = round_to(t, q);
  const float r = rint(q);
  if (zero_point) return uint8_t(clamp(r + float(p.zero_point), 0.0f, float((1 << bits) - 1)));
  return uint8_t(int8_t(clamp(r, -float(1 << (bits - 1)), float((1 << (bits - 1)) - 1))));
}

// ---- ONNX Runtime's zero-point RTN (MLAS's blockwise quantizer, the one its MatMulNBits quantizer calls):
// the range always holds 0, the scale (max - min) / maxq in float, the zero point roundf(-min / scale) from
// that unrounded scale, the stored scale rounded to the weight's type, and the codes from the stored
// scale's reciprocal: roundf(w * (1 / s) + z). One departure: an all-zero block gets ModelOpt's
// smallest scale where MLAS writes 0 (which a QuantizeLinear, --format qdq, would divide by): the same
// codes (z, 0) and the same dequantized zeros.
NIBBLE_HD inline Params params_zero_point_ort(float mn, float mx, int bits, int t) {
  const float maxq = float((1 << bits) - 1);
  mn = min(mn, 0.0f), mx = max(mx, 0.0f);
  const float sf = (mx - mn) / maxq;
  const float z = sf != 0.0f ? 0.0f - mn / sf : mn;
  Params p{sf != 0.0f ? round_to(t, sf) : min_scale(t), 0};
  p.zero_point = uint8_t(z < 0.0f ? 0.0f : (z > maxq ? maxq : round_half_away(z)));
  return p;
}
NIBBLE_HD inline float reciprocal_ort(float scale) { return scale != 0.0f ? 1.0f / scale : 0.0f; }
NIBBLE_HD inline uint8_t quantize_ort(float w, float reciprocal, uint8_t zero_point, int bits) {
  return uint8_t(clamp(round_half_away(w * reciprocal + float(zero_point)), 0.0f, float((1 << bits) - 1)));
}
// ---- ONNX Runtime's symmetric RTN (the same quantizer without zero points): the block's extreme e, of its min
// and max the one of larger magnitude (the min on a tie), lands on the code -2^(b-1): the scale is
// -e / 2^(b-1) in float, stored rounded to the weight's type (negative where e is positive), and a code is
// roundf(w * (1 / s) + 2^(b-1)) clamped to [0, 2^b - 1], less 2^(b-1) (two's complement, as every symmetric
// code here). Zero-padding a partial block changes neither min nor max's choice, so callers may pass the
// padded range. The all-zero block keeps the zero-point path's departure above.
NIBBLE_HD inline Params params_symmetric_ort(float mn, float mx, int bits, int t) {
  const float e = fabs(mx) > fabs(mn) ? mx : mn;
  const float sf = -e / float(1 << (bits - 1));
  return Params{sf != 0.0f ? round_to(t, sf) : min_scale(t), 0};
}
NIBBLE_HD inline uint8_t quantize_symmetric_ort(float w, float reciprocal, int bits) {
  const int half = 1 << (bits - 1);
  return uint8_t(int8_t(int(quantize_ort(w, reciprocal, uint8_t(half), bits)) - half));
}
NIBBLE_HD inline float dequantize(uint8_t code, Params p, bool zero_point) {
  const int q = zero_point ? int(code) - int(p.zero_point) : int(int8_t(code));
  return float(q) * p.scale;
}

}  // namespace nibble::kernels::hd

// The one float power nibble's kernels use (HQQ's shrinkage |r|^(p-1)), the same bits on every backend:
// the CPU reference, the threaded CPU kernels, the emulated device and a GPU (NIBBLE_HD). libm's powf
// and a GPU's powf are each accurate to about an ulp but not to the same bits, so neither is called:
// x^y = exp(y·ln x) is computed in double with IEEE +, -, ×, ÷ only (no fused multiply-adds: the
// kernel libraries build with -ffp-contract=off and nvcc --fmad=false, and none is written here) and
// rounded to float once. The double is within a few 1e-15 relative of x^y, so the float is the
// correctly rounded x^y except where x^y lies that close to a midpoint between two floats. Measured
// against long double (tests/unit/test_hd_pow.cc): within 3.5e-15 on 5.5 M points (x in [1e-9, 1e4],
// y from -0.1 to -0.9), correctly rounded at all of them; over all 307 M floats x in [1e-8, 1e3) with
// y = -0.3 (HQQ's), at all but one (a near-tie, 0.50000001 ulp off). glibc's powf differs from it at
// 0.063% of those points: it is not correctly rounded.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/half_float.h"

namespace nibble {

NIBBLE_HD inline double bits_f64(uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, 8);
  return d;
#endif
}

namespace pow_detail {

// ln 2 split so that k·kLn2Hi is exact for |k| < 2^11 (its last 11 mantissa bits are zero).
constexpr double kLn2Hi = 0.6931471805598903, kLn2Lo = 5.497923018708371e-14, kInvLn2 = 1.4426950408889634;
constexpr double kRoundMagic64 = 6755399441055744.0;  // 1.5·2^52: adding it leaves no fraction bits

// ln m for m in [√½, √2]: 2·atanh(s), s = (m - 1)/(m + 1), |s| ≤ 0.1716: 2s + 2s·u·P(u), u = s², P the
// series' coefficients 1/3 .. 1/23 (the terms after s^23/23 are below 2^-60 of s). P is evaluated by
// Estrin's scheme (pairs, then powers u², u⁴, u⁸): a shorter dependency chain than Horner's, as accurate.
NIBBLE_HD inline double log_reduced(double m) {
  const double s = (m - 1.0) / (m + 1.0), u = s * s, u2 = u * u, u4 = u2 * u2, u8 = u4 * u4;
  const double q0 = 0.3333333333333333 + 0.2 * u, q1 = 0.14285714285714285 + 0.1111111111111111 * u;
  const double q2 = 0.09090909090909091 + 0.07692307692307693 * u;
  const double q3 = 0.06666666666666667 + 0.058823529411764705 * u;
  const double q4 = 0.05263157894736842 + 0.047619047619047616 * u, q5 = 0.043478260869565216;
  const double p = ((q0 + q1 * u2) + (q2 + q3 * u2) * u4) + (q4 + q5 * u2) * u8;
  return 2.0 * s + 2.0 * s * (u * p);
}

// ln x of a positive finite float: x = m·2^e with m in [√½, √2).
NIBBLE_HD inline double log_of(float x) {
  uint32_t u = f32_bits(x);
  int e = 0;
  if (u < 0x00800000u) {  // subnormal: ×2^24 is exact
    u = f32_bits(x * 16777216.0f);
    e = -24;
  }
  e += int(u >> 23) - 127;
  double m = double(bits_f32((u & 0x007fffffu) | 0x3f800000u));  // [1, 2)
  if (m > 1.4142135623730951) m *= 0.5, e += 1;
  const double k = double(e);
  return k * kLn2Hi + (log_reduced(m) + k * kLn2Lo);
}

// e^t for t in [-110, 89] (outside, the float result is 0 or inf anyway): t = k·ln 2 + r, |r| ≤ ½ ln 2,
// e^r by its Taylor polynomial to r^13/13! (the rest is below 2^-57; Estrin's scheme), times 2^k.
NIBBLE_HD inline double exp_of(double t) {
  t = t < -110.0 ? -110.0 : (t > 89.0 ? 89.0 : t);
  const double kd = (t * kInvLn2 + kRoundMagic64) - kRoundMagic64;
  const double r = (t - kd * kLn2Hi) - kd * kLn2Lo, r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  const double p0 = 1.0 + r, p1 = 0.5 + 0.16666666666666666 * r;
  const double p2 = 0.041666666666666664 + 0.008333333333333333 * r;
  const double p3 = 0.001388888888888889 + 0.0001984126984126984 * r;
  const double p4 = 2.48015873015873e-05 + 2.7557319223985893e-06 * r;
  const double p5 = 2.755731922398589e-07 + 2.505210838544172e-08 * r;
  const double p6 = 2.08767569878681e-09 + 1.6059043836821613e-10 * r;
  const double w0 = (p0 + p1 * r2) + (p2 + p3 * r2) * r4, w1 = (p4 + p5 * r2) + p6 * r4;
  return (w0 + w1 * r8) * bits_f64(uint64_t(int64_t(kd) + 1023) << 52);
}

}  // namespace pow_detail

// x^y in double, before the one rounding to float (exposed for the accuracy test). x ≥ 0: x = 0 and
// x = inf give 0, 1 or inf by the sign of y, as pow does; a negative or NaN x, or a NaN y, gives NaN.
NIBBLE_HD inline double pow_nonneg_double(float x, float y) {
  if (!(x > 0.0f) || !(x < INFINITY) || y != y) {
    if (x == 0.0f || x == INFINITY) {
      const bool big = (x == 0.0f) == (y < 0.0f);
      return y == 0.0f ? 1.0 : (big ? double(INFINITY) : 0.0);
    }
    return double(NAN);
  }
  return pow_detail::exp_of(double(y) * pow_detail::log_of(x));
}

// x^y rounded to float once (the function the kernels call).
NIBBLE_HD inline float pow_nonneg(float x, float y) { return float(pow_nonneg_double(x, y)); }

}  // namespace nibble

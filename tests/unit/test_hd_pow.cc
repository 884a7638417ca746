// kernels/hd_pow.h, the float power every backend computes the same bits of (HQQ's |r|^(p-1)), against
// powl in long double (64-bit significand: its error is far below what is measured here) over a dense
// sweep of x, for the exponents HQQ uses (lp_norm - 1) and a few more.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "kernels/hd_pow.h"

using namespace nibble;

namespace {

// One float ulp at the magnitude of v (v a normal float's value).
long double ulp_at(float v) {
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0L, e - 24);
}

struct Sweep {
  long n = 0, not_correctly_rounded = 0, not_libm = 0;
  long double max_rel_double = 0, max_ulps = 0;
};

// Every `stride`-th float in [lo, hi).
Sweep sweep(float y, float lo, float hi, uint32_t stride) {
  Sweep s;
  for (uint32_t u = f32_bits(lo); u < f32_bits(hi); u += stride) {
    const float x = bits_f32(u);
    const long double exact = powl(static_cast<long double>(x), static_cast<long double>(y));
    const double d = pow_nonneg_double(x, y);
    const float f = pow_nonneg(x, y);
    const float nearest = static_cast<float>(exact);
    s.max_rel_double = std::max(s.max_rel_double, std::fabs((static_cast<long double>(d) - exact) / exact));
    s.max_ulps = std::max(s.max_ulps, std::fabs(static_cast<long double>(f) - exact) / ulp_at(nearest));
    s.not_correctly_rounded += f != nearest;
    s.not_libm += f != std::pow(x, y);
    ++s.n;
  }
  return s;
}

}  // namespace

// x from 1e-9 to 1e4 (HQQ's |r| + 1e-8 spans 1e-8 to the block's range), every 331st float: 1.09 M
// points per exponent, 5.5 M in all. Measured (x86-64, glibc 2.36): the double before rounding within
// 3.5e-15 relative, the float within 0.49999995 ulp, correctly rounded at every point; glibc's powf
// differs at about 0.063% of them (it is not correctly rounded).
TEST(HdPow, CorrectlyRoundedOverADenseSweep) {
  long n = 0, off_libm = 0;
  for (float y : {-0.3f, -0.5f, -0.1f, -0.9f, -0.7f}) {
    const Sweep s = sweep(y, 1e-9f, 1e4f, 331);
    EXPECT_GT(s.n, 1000000);
    EXPECT_LT(s.max_rel_double, 1e-14L) << y;
    EXPECT_LE(s.max_ulps, 0.5L + 1e-6L) << y;
    EXPECT_LE(s.not_correctly_rounded, s.n / 1000000) << y;  // only near-ties may round the other way
    EXPECT_LT(s.not_libm, s.n / 500) << y;
    std::printf("y %g: %ld points, double within %.3Lg relative, float within %.9Lf ulp, %ld not correctly "
                "rounded, %ld differ from powf\n",
                double(y), s.n, s.max_rel_double, s.max_ulps, s.not_correctly_rounded, s.not_libm);
    n += s.n, off_libm += s.not_libm;
  }
  RecordProperty("differ_from_powf_per_million", std::to_string(off_libm * 1000000 / n));
}

// The ends of the domain, and subnormal x (the exponent split scales them first).
TEST(HdPow, EdgesOfTheDomain) {
  EXPECT_EQ(pow_nonneg(1.0f, -0.3f), 1.0f);
  EXPECT_EQ(pow_nonneg(4.0f, 0.5f), 2.0f);
  EXPECT_EQ(pow_nonneg(0.25f, -0.5f), 2.0f);
  EXPECT_EQ(pow_nonneg(7.0f, 0.0f), 1.0f);
  EXPECT_EQ(pow_nonneg(0.0f, -0.3f), INFINITY);
  EXPECT_EQ(pow_nonneg(0.0f, 0.5f), 0.0f);
  EXPECT_EQ(pow_nonneg(INFINITY, -0.3f), 0.0f);
  EXPECT_EQ(pow_nonneg(INFINITY, 0.5f), INFINITY);
  EXPECT_TRUE(std::isnan(pow_nonneg(-1.0f, -0.3f)));
  EXPECT_TRUE(std::isnan(pow_nonneg(NAN, -0.3f)));
  EXPECT_EQ(pow_nonneg(1e30f, 2.0f), INFINITY);  // past float's range
  EXPECT_EQ(pow_nonneg(1e-30f, 2.0f), 0.0f);
  for (float x : {1e-45f, 3e-42f, 1.1754942e-38f, 1e-8f})
    for (float y : {-0.3f, -0.9f, 0.5f}) {
      const long double exact = powl(static_cast<long double>(x), static_cast<long double>(y));
      EXPECT_EQ(pow_nonneg(x, y), static_cast<float>(exact)) << x << " " << y;
    }
}

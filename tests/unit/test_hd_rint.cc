// kernels/hd_float.h's rint (round half to even without libm's call) against std::nearbyint in the default
// rounding mode, bit for bit (the sign of zero included) over every 61st float bit pattern, and at the
// edges where the trick could fail: halves, 2^22..2^23, 2^23 and above, infinities.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/hd_float.h"

using namespace nibble;

namespace {

bool same_bits(float a, float b) { return f32_bits(a) == f32_bits(b); }

TEST(HdRint, MatchesNearbyintOverASweepOfFloats) {
  long mismatches = 0, n = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 61) {
    const float x = bits_f32(uint32_t(u));
    if (std::isnan(x)) continue;
    ++n;
    mismatches += !same_bits(kernels::hd::rint(x), std::nearbyint(x));
  }
  EXPECT_GT(n, 70000000);
  EXPECT_EQ(mismatches, 0);
}

TEST(HdRint, EdgesRoundHalfToEvenAndKeepTheSign) {
  const float edges[] = {0.5f,       1.5f,       2.5f,        -0.5f,      -2.5f,      -0.0f,     0.0f,
                         -0.3f,      4194303.5f, 4194304.5f,  8388607.5f, -8388607.5f, 8388608.0f, 16777217.0f,
                         1e30f,      -1e30f,     std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()};
  for (float x : edges) EXPECT_TRUE(same_bits(kernels::hd::rint(x), std::nearbyint(x))) << x;
  EXPECT_EQ(kernels::hd::rint(2.5f), 2.0f);
  EXPECT_EQ(kernels::hd::rint(3.5f), 4.0f);
  EXPECT_TRUE(std::signbit(kernels::hd::rint(-0.3f)));
  EXPECT_TRUE(std::isnan(kernels::hd::rint(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace

// fp16/bf16 conversions: exact bit patterns, ties to even, and every fp16 value round-trips.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/dtype.h"

using namespace nibble;

TEST(DType, HalfKnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e-5f), 0x00a8);     // ModelOpt's CLIP_MIN is a subnormal in fp16
  EXPECT_EQ(float_to_half(0.1f), 0x2e66);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_half(NAN) & 0x7c00, 0x7c00);
  EXPECT_NE(float_to_half(NAN) & 0x03ff, 0);
}

TEST(DType, HalfTiesToEven) {
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // halfway, even stays
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway, odd rounds up
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);             // half of the smallest subnormal
  EXPECT_EQ(float_to_half(3 * std::ldexp(1.0f, -25)), 0x0002);
}

TEST(DType, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(DType, BFloat16) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(round_to(DType::kBFloat16, 3.14159f), 3.140625f);
}

TEST(DType, LoadStore) {
  uint16_t buf[2];
  store_float(DType::kFloat16, buf, 1, 0.5f);
  EXPECT_EQ(buf[1], 0x3800);
  EXPECT_EQ(load_float(DType::kFloat16, buf, 1), 0.5f);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt4), 0u);
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bf16");
}

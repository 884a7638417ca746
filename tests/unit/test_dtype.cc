// fp16/bf16 conversions (kernels/half_float.h, the one every backend uses): exact bit patterns, ties
// to even, every fp16 value round-trips, and every result equals the plain reference (half_ref.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "half_ref.h"

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

// The conversions against the plain reference. They run here over arrays, in loops the compiler
// vectorizes like the kernels' (the kernels' own AVX2/AVX-512 copies are checked against the
// reference kernel in test_backend_parity.cc).
namespace {

void check_float_patterns(const std::vector<uint32_t>& bits) {
  using namespace nibble::test;
  const size_t n = bits.size();
  std::vector<float> in(n), rh(n), rb(n);
  std::vector<uint16_t> h(n), b(n);
  std::memcpy(in.data(), bits.data(), n * 4);
  for (size_t i = 0; i < n; ++i) h[i] = float_to_half(in[i]);
  for (size_t i = 0; i < n; ++i) b[i] = float_to_bf16(in[i]);
  for (size_t i = 0; i < n; ++i) rh[i] = round_to_half(in[i]);
  for (size_t i = 0; i < n; ++i) rb[i] = round_to_bf16(in[i]);
  for (size_t i = 0; i < n; ++i) {
    const float f = in[i];
    ASSERT_EQ(h[i], float_to_half_ref(f)) << "float 0x" << std::hex << bits[i];
    ASSERT_EQ(b[i], float_to_bf16_ref(f)) << "float 0x" << std::hex << bits[i];
    const float want_h = half_to_float_ref(float_to_half_ref(f));
    const float want_b = bf16_to_float_ref(float_to_bf16_ref(f));
    ASSERT_EQ(f32_bits(rh[i]), f32_bits(want_h)) << "float 0x" << std::hex << bits[i];
    ASSERT_EQ(f32_bits(rb[i]), f32_bits(want_b)) << "float 0x" << std::hex << bits[i];
  }
}

}  // namespace

TEST(DType, EveryHalfAndBf16ToFloatMatchesReference) {
  std::vector<uint16_t> h(0x10000);
  std::vector<float> f(h.size()), g(h.size());
  for (uint32_t i = 0; i < 0x10000; ++i) h[i] = uint16_t(i);
  for (size_t i = 0; i < h.size(); ++i) f[i] = half_to_float(h[i]);
  for (size_t i = 0; i < h.size(); ++i) g[i] = bf16_to_float(h[i]);
  for (uint32_t i = 0; i < 0x10000; ++i) {
    ASSERT_EQ(f32_bits(f[i]), f32_bits(test::half_to_float_ref(uint16_t(i)))) << "half 0x" << std::hex << i;
    ASSERT_EQ(f32_bits(g[i]), f32_bits(test::bf16_to_float_ref(uint16_t(i)))) << "bf16 0x" << std::hex << i;
  }
}

// Every sign/exponent/high-mantissa prefix (the top 19 bits) with the 13 bits that fp16 drops set
// to the patterns that decide rounding (0, 1, just below / at / above the tie, all ones) and to
// random ones; then 2^24 random patterns. 2^24 + 2^19 * 12 floats: about 0.3 s.
TEST(DType, ConversionsMatchReferenceOnFloatPatterns) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
  std::mt19937 rng(12345);
  std::vector<uint32_t> bits;
  bits.reserve(size_t(1) << 24);
  for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
    for (uint32_t lo : lows) bits.push_back((hi << 13) | lo);
    for (int r = 0; r < 4; ++r) bits.push_back((hi << 13) | (rng() & 0x1fffu));
    if (bits.size() >= (size_t(1) << 22)) {
      check_float_patterns(bits);
      if (HasFatalFailure()) return;
      bits.clear();
    }
  }
  check_float_patterns(bits);
  if (HasFatalFailure()) return;
  bits.clear();
  for (uint32_t i = 0; i < (1u << 24); ++i) bits.push_back(uint32_t(rng()));
  check_float_patterns(bits);
}

TEST(DType, HalfEdgeValues) {
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the tie above the largest half: inf
  EXPECT_EQ(float_to_half(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_half(1e-5f), 0x00a8);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);      // tie -> even (0)
  EXPECT_EQ(float_to_half(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(float_to_half(std::ldexp(1023.5f, -24)), 0x0400);   // top subnormal rounds to 2^-14
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half(NAN), test::float_to_half_ref(NAN));
  EXPECT_EQ(round_to_half(65519.0f), 65504.0f);
  EXPECT_EQ(round_to_half(65520.0f), INFINITY);
  EXPECT_EQ(round_to_half(1.0f + std::ldexp(1.0f, -11)), 1.0f);
  EXPECT_EQ(round_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(round_to_half(NAN)));
}

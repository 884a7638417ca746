// Exact bytes of every packed layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/dequant_ref.h"
#include "kernels/cpu/pack.h"
#include "kernels/dtype.h"

using namespace nibble;
using namespace nibble::kernels;

TEST(Pack, OnnxInt4LowNibbleFirst) {
  // codes 1, -1, 7, -8, 3 (two's complement bytes) -> 0xF1, 0x87, 0x03 (odd count: high nibble 0)
  std::vector<uint8_t> codes = {1, uint8_t(-1), 7, uint8_t(-8), 3};
  EXPECT_EQ(pack_onnx(codes, 4), (std::vector<uint8_t>{0xF1, 0x87, 0x03}));
  EXPECT_EQ(unpack_onnx(pack_onnx(codes, 4), 5, 4),
            (std::vector<uint8_t>{1, 0x0F, 7, 0x08, 3}));  // nibbles
  EXPECT_EQ(pack_onnx(codes, 8), codes);
}

// Packed in chunks across threads: every byte as the pairwise rule gives it, across chunk edges and an odd tail.
TEST(Pack, OnnxInt4LargeOddCountAcrossChunks) {
  std::mt19937 rng(5);
  std::vector<uint8_t> codes(size_t(3) * (size_t(1) << 21) + 7);
  for (auto& c : codes) c = uint8_t(rng());
  const std::vector<uint8_t> got = pack_onnx(codes, 4);
  ASSERT_EQ(got.size(), (codes.size() + 1) / 2);
  size_t differ = 0;
  for (size_t i = 0; i + 1 < codes.size(); i += 2)
    differ += got[i / 2] != uint8_t((codes[i] & 0x0f) | (codes[i + 1] << 4));
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(got.back(), codes.back() & 0x0f);
}

TEST(Pack, MatMulNBitsSymmetric) {
  // K = 20, N = 2, block 16 -> G = 2, blob 8 bytes; stored [K, N].
  const int64_t K = 20, N = 2;
  WeightMatrix shape{DType::kFloat32, nullptr, K, N, 0};
  QuantSpec spec{4, 16, false};
  QuantResult q;
  q.groups = 2;
  q.codes.resize(size_t(K * N));
  for (int64_t k = 0; k < K; ++k) {
    q.codes[size_t(k * N + 0)] = uint8_t(int8_t((k % 15) - 7));  // -7..7
    q.codes[size_t(k * N + 1)] = uint8_t(int8_t(-8));
  }
  q.scales = {1, 2, 3, 4};  // [G, N]
  auto b = pack_matmulnbits_weight(shape, spec, q, 16);
  ASSERT_EQ(b.size(), size_t(N * 2 * 8));
  // column 0, block 0: u[k] = (k % 15) - 7 + 8 = k % 15 + 1 -> byte j = u[2j] | u[2j+1] << 4
  EXPECT_EQ(b[0], uint8_t(1 | (2 << 4)));
  EXPECT_EQ(b[7], uint8_t(15 | (1 << 4)));  // k = 14 -> 15, k = 15 -> 0 + 1
  // column 0, block 1: k = 16..19 -> u = 2, 3, 4, 5; k >= 20 is padding -> code of zero = 8
  EXPECT_EQ(b[8], uint8_t(2 | (3 << 4)));
  EXPECT_EQ(b[9], uint8_t(4 | (5 << 4)));
  EXPECT_EQ(b[10], 0x88);
  // column 1: all -8 -> u = 0
  EXPECT_EQ(b[16], 0x00);
  EXPECT_EQ(b[24 + 2], 0x88);  // column 1 block 1 padding
  EXPECT_EQ(matmulnbits_scales(shape, q), (std::vector<float>{1, 3, 2, 4}));  // [N, G]
}

TEST(Pack, MatMulNBitsZeroPointsAndPadding) {
  const int64_t K = 40, N = 1;  // block 16 -> G = 3
  WeightMatrix shape{DType::kFloat32, nullptr, K, N, 0};
  QuantSpec spec{4, 16, true};
  QuantResult q;
  q.groups = 3;
  q.codes.assign(size_t(K), 9);
  q.zero_points = {3, 12, 5};
  q.scales = {1, 1, 1};
  auto zp = pack_matmulnbits_zero_points(shape, spec, q);
  EXPECT_EQ(zp, (std::vector<uint8_t>{uint8_t(3 | (12 << 4)), 5}));
  auto b = pack_matmulnbits_weight(shape, spec, q, 16);
  EXPECT_EQ(b[0], 0x99);
  EXPECT_EQ(b[2 * 8 + 3], 0x99);  // k = 38, 39
  EXPECT_EQ(b[2 * 8 + 4], 0x55);  // padding holds the block's zero point
}

TEST(Pack, MatMulNBitsPerChannelPaddedBlock) {
  // Per channel with K = 20: one block of 20 laid out in a 32-wide MatMulNBits block.
  const int64_t K = 20, N = 1;
  WeightMatrix shape{DType::kFloat32, nullptr, K, N, 0};
  QuantSpec spec{4, 20, false};
  QuantResult q;
  q.groups = 1;
  q.codes.assign(size_t(K), uint8_t(int8_t(-1)));  // u = 7
  q.scales = {1};
  auto b = pack_matmulnbits_weight(shape, spec, q, 32);
  ASSERT_EQ(b.size(), 16u);
  EXPECT_EQ(b[9], 0x77);
  EXPECT_EQ(b[10], 0x88);
}

TEST(Pack, MatMulNBits8Bit) {
  const int64_t K = 16, N = 1;
  WeightMatrix shape{DType::kFloat32, nullptr, K, N, 0};
  QuantSpec spec{8, 16, false};
  QuantResult q;
  q.groups = 1;
  q.codes.assign(size_t(K), uint8_t(int8_t(-128)));
  q.codes[1] = 127;
  q.scales = {1};
  auto b = pack_matmulnbits_weight(shape, spec, q, 16);
  EXPECT_EQ(b[0], 0x00);
  EXPECT_EQ(b[1], 0xFF);
}

// ---- dequantize_ref: the float weight qdq stores for GPTQ

TEST(Dequantize, SymmetricAndZeroPointLayouts) {
  // [K=3, N=2], block 2 -> G = 2, k_axis 0: scales [G, N]
  WeightMatrix kn{DType::kFloat32, nullptr, 3, 2, 0};
  QuantResult q;
  q.groups = 2;
  q.codes = {uint8_t(-8), 7, 1, uint8_t(-1), 3, 0};
  q.scales = {0.5f, 2.0f, 0.25f, 4.0f};
  QuantSpec sym{4, 2, false};
  auto b = dequantize_ref(kn, sym, q, DType::kFloat32);
  std::vector<float> v(6);
  std::memcpy(v.data(), b.data(), b.size());
  EXPECT_EQ(v, (std::vector<float>{-4.0f, 14.0f, 0.5f, -2.0f, 0.75f, 0.0f}));
  // the same codes as unsigned with zero points, stored transposed ([N=2, K=3], k_axis 1: scales [N, G])
  WeightMatrix nk{DType::kFloat32, nullptr, 2, 3, 1};
  QuantResult z;
  z.groups = 2;
  z.codes = {15, 0, 8, 3, 4, 5};  // column n = row n of the stored weight
  z.scales = {1.0f, 2.0f, 0.5f, 3.0f};
  z.zero_points = {8, 1, 0, 5};
  QuantSpec asym{4, 2, true};
  b = dequantize_ref(nk, asym, z, DType::kFloat32);
  std::memcpy(v.data(), b.data(), b.size());
  EXPECT_EQ(v, (std::vector<float>{7.0f, -8.0f, 14.0f, 1.5f, 2.0f, 0.0f}));
}

// QuantizeLinear computes round_half_even(x / s) + z in float32 (fp16 inputs widened): from the stored
// s·(q − z) it must give back q for every code, scale and dtype, including the fp16 rounding of the
// product. Scales span the fp16 range (subnormals included) and random float32 mantissas.
TEST(Dequantize, QuantizeLinearRecoversEveryCode) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    for (bool zp : {false, true}) {
      for (int e = -24; e <= 10; ++e) {
        const float s = round_to(dt, std::ldexp(mant(rng), e));
        if (s == 0.0f) continue;
        const int lo = zp ? 0 : -8, hi = zp ? 15 : 7;
        for (int zero = zp ? 0 : 0; zero <= (zp ? 15 : 0); ++zero)
          for (int c = lo; c <= hi; ++c) {
            WeightMatrix one{dt, nullptr, 1, 1, 0};
            QuantResult q;
            q.groups = 1;
            q.codes = {uint8_t(c)};
            q.scales = {s};
            if (zp) q.zero_points = {uint8_t(zero)};
            const auto b = dequantize_ref(one, QuantSpec{4, 16, zp}, q, dt);
            const float x = load_float(dt, b.data(), 0);
            const float back = std::nearbyint(x / s) + float(zp ? zero : 0);
            ASSERT_EQ(back, float(c)) << dtype_name(dt) << " s=" << s << " zero=" << zero;
          }
      }
    }
  }
}

// RTN reference: scales and codes against values computed by hand / with numpy's float16
// arithmetic (the numbers in the comments), layouts, and thread-count independence.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

QuantResult run(const std::vector<float>& w, int64_t rows, int64_t cols, int k_axis, QuantSpec spec) {
  WeightMatrix m;
  m.dtype = DType::kFloat32;
  m.data = w.data();
  m.rows = rows;
  m.cols = cols;
  m.k_axis = k_axis;
  QuantResult q;
  rtn_quantize_ref(m, spec, q);
  return q;
}

std::vector<int> signed_codes(const QuantResult& q) {
  std::vector<int> out;
  for (uint8_t c : q.codes) out.push_back(int(int8_t(c)));
  return out;
}

}  // namespace

TEST(Rtn, SymmetricHandComputed) {
  // One column, K = 8, one block: amax = 7 -> s = 1; rint is half-to-even (2.5 -> 2, 3.5 -> 4).
  std::vector<float> w = {1, -2, 3.5f, 7, 2.5f, -7, 0.5f, -0.4f};
  QuantSpec spec{4, 8, false};
  auto q = run(w, 8, 1, 0, spec);
  ASSERT_EQ(q.scales.size(), 1u);
  EXPECT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(signed_codes(q), (std::vector<int>{1, -2, 4, 7, 2, -7, 0, 0}));
  // error: (3.5-4)^2 + (2.5-2)^2 + 0.5^2 + 0.4^2
  EXPECT_NEAR(q.sq_error, 0.25 + 0.25 + 0.25 + 0.16, 1e-6);
}

TEST(Rtn, AllZeroBlockGetsMinScale) {
  std::vector<float> w(16, 0.0f);
  auto q = run(w, 16, 1, 0, QuantSpec{4, 16, false});
  EXPECT_EQ(q.scales[0], 1e-5f);
  for (uint8_t c : q.codes) EXPECT_EQ(c, 0);
}

TEST(Rtn, Fp16MatchesNumpyArithmetic) {
  // numpy: w = float16([0.1, -0.37, 0.5, 0.2113, -0.05, 0.3301, 0.0007, -0.2])
  // s = maximum(abs(w).max() / 7, 1e-5) -> float16 0x2c92; q = rint(w / s) = [1,-5,7,3,-1,5,0,-3]
  const std::vector<uint16_t> w = {0x2e66, 0xb5ec, 0x3800, 0x32c3, 0xaa66, 0x3548, 0x11bc, 0xb266};
  WeightMatrix m{DType::kFloat16, w.data(), 8, 1, 0};
  QuantResult q;
  rtn_quantize_ref(m, QuantSpec{4, 8, false}, q);
  EXPECT_EQ(float_to_half(q.scales[0]), 0x2c92);
  EXPECT_EQ(signed_codes(q), (std::vector<int>{1, -5, 7, 3, -1, 5, 0, -3}));
  // Zero point: s = maximum(mx - mn, 1e-5) / 15 -> 0x2b6d, z = 6, q = [8,0,15,10,5,12,6,3]
  rtn_quantize_ref(m, QuantSpec{4, 8, true}, q);
  EXPECT_EQ(float_to_half(q.scales[0]), 0x2b6d);
  ASSERT_EQ(q.zero_points.size(), 1u);
  EXPECT_EQ(q.zero_points[0], 6);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{8, 0, 15, 10, 5, 12, 6, 3}));
}

TEST(Rtn, Fp32ScaleIsFloatDivision) {
  std::vector<float> w = {0.1f, -0.37f, 0.5f, 0.2113f};
  auto q = run(w, 4, 1, 0, QuantSpec{4, 16, false});  // partial block: K = 4 < 16
  EXPECT_EQ(q.scales[0], 0.5f / 7.0f);
  EXPECT_EQ(q.groups, 1);
}

TEST(Rtn, ZeroPointPartialBlockIncludesPadding) {
  // K = 3 with block 4: ModelOpt pads with a zero, so min becomes 0 for an all-positive block.
  std::vector<float> w = {1.0f, 2.0f, 1.5f};
  auto q = run(w, 3, 1, 0, QuantSpec{4, 4, true});
  EXPECT_EQ(q.scales[0], 2.0f / 15.0f);
  EXPECT_EQ(q.zero_points[0], 0);
  // The same values in a full block: min 1 -> s = 1/15, z = clip(-rint(15), 0, 15) = 0
  std::vector<float> w4 = {1.0f, 2.0f, 1.5f, 1.0f};
  auto q4 = run(w4, 4, 1, 0, QuantSpec{4, 4, true});
  EXPECT_EQ(q4.scales[0], 1.0f / 15.0f);
}

// ONNX Runtime's zero-point arithmetic (MLAS's blockwise quantizer), by hand: [min(x, 0), max(x, 0)],
// s = range / 15, z = roundf(-min / s), codes roundf(x * (1 / s) + z), halves away from zero.
TEST(Rtn, OnnxRuntimeZeroPointHandComputed) {
  QuantSpec spec{4, 8, true};
  spec.rtn_arithmetic = RtnArithmetic::kOnnxRuntime;
  // min -1.5, max 6: s = 0.5, z = 3; 0.25 -> 3.5 -> 4 (ModelOpt: rint(0.5) + 3 = 3), 0.75 -> 4.5 -> 5.
  std::vector<float> w = {-1.5f, 6.0f, 0.25f, 0.75f, -0.25f, 1.0f, 0.0f, 2.2f};
  auto q = run(w, 8, 1, 0, spec);
  EXPECT_EQ(q.scales[0], 0.5f);
  EXPECT_EQ(q.zero_points[0], 3);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0, 15, 4, 5, 3, 5, 3, 7}));
  auto m = run(w, 8, 1, 0, QuantSpec{4, 8, true});
  EXPECT_EQ(m.codes[2], 3);  // ModelOpt's half to even
  // min -1.25, max 6.25: s = 0.5, z = roundf(2.5) = 3, where ModelOpt's -rint(-2.5) is 2.
  w = {-1.25f, 6.25f, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(run(w, 8, 1, 0, spec).zero_points[0], 3);
  EXPECT_EQ(run(w, 8, 1, 0, QuantSpec{4, 8, true}).zero_points[0], 2);
  // An all-positive full block: ONNX Runtime's range still holds 0 (s = 8 / 15, z = 0); ModelOpt's is
  // [1, 8] (s = 7 / 15).
  w = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(run(w, 8, 1, 0, spec).scales[0], 8.0f / 15.0f);
  EXPECT_EQ(run(w, 8, 1, 0, QuantSpec{4, 8, true}).scales[0], 7.0f / 15.0f);
  // An all-zero block: z = 0 and every code 0, as MLAS; the scale is ModelOpt's smallest where MLAS
  // writes 0 (a QuantizeLinear would divide by it).
  q = run(std::vector<float>(8, 0.0f), 8, 1, 0, spec);
  EXPECT_EQ(q.scales[0], 1e-5f);
  EXPECT_EQ(q.zero_points[0], 0);
  EXPECT_EQ(q.codes, std::vector<uint8_t>(8, 0));
}

// ONNX Runtime's symmetric arithmetic by hand: the extreme e (of min and max, the larger magnitude; the min
// on a tie) lands on code -8: s = -e / 8; codes roundf(x * (1 / s) + 8) - 8, halves away from zero.
TEST(Rtn, OnnxRuntimeSymmetricHandComputed) {
  QuantSpec spec{4, 8, false};
  spec.rtn_arithmetic = RtnArithmetic::kOnnxRuntime;
  // e = 4 (positive): s = -0.5; -3.5 -> 7; 1.25 -> -2.5 + 8 = 5.5 -> 6 -> -2 (the half rounds up in the
  // unsigned code: rint would give -2 as well, roundf(-2.5) -3); 0.75 -> -1.5 + 8 = 6.5 -> 7 -> -1.
  std::vector<float> w = {4.0f, 1.25f, -3.5f, 0.75f, -0.25f, 0.0f, -2.0f, 3.0f};
  auto q = run(w, 8, 1, 0, spec);
  EXPECT_EQ(q.scales[0], -0.5f);
  EXPECT_EQ(signed_codes(q), (std::vector<int>{-8, -2, 7, -1, 1, 0, 4, -6}));
  // -4 and 4: a tie, the min wins: s = 0.5, 4 -> 8 clamps to 7.
  w = {-4.0f, 4.0f, 1.0f, 0, 0, 0, 0, 0};
  q = run(w, 8, 1, 0, spec);
  EXPECT_EQ(q.scales[0], 0.5f);
  EXPECT_EQ(signed_codes(q)[0], -8);
  EXPECT_EQ(signed_codes(q)[1], 7);
  // A partial block (K = 5, block 4): the last block holds one value, its own extreme.
  w = {1, 2, 3, 4, -0.5f};
  q = run(w, 5, 1, 0, QuantSpec{4, 4, false, DType::kUndefined, RtnArithmetic::kOnnxRuntime});
  EXPECT_EQ(q.scales[0], -0.5f);
  EXPECT_EQ(q.scales[1], 0.0625f);
  EXPECT_EQ(signed_codes(q)[4], -8);
  // An all-zero block: every code 0; the scale is ModelOpt's smallest where MLAS writes 0.
  q = run(std::vector<float>(8, 0.0f), 8, 1, 0, spec);
  EXPECT_EQ(q.scales[0], 1e-5f);
  EXPECT_EQ(signed_codes(q), std::vector<int>(8, 0));
  // 8 bits: s = -e / 128.
  QuantSpec s8{8, 8, false};
  s8.rtn_arithmetic = RtnArithmetic::kOnnxRuntime;
  w = {-64.0f, 32.0f, 0.25f, 0, 0, 0, 0, 0};
  q = run(w, 8, 1, 0, s8);
  EXPECT_EQ(q.scales[0], 0.5f);
  EXPECT_EQ(signed_codes(q)[0], -128);
  EXPECT_EQ(signed_codes(q)[1], 64);
  EXPECT_EQ(signed_codes(q)[2], 1);  // 0.5 + 128 = 128.5 -> 129, less 128
}

TEST(Rtn, Int8PerChannel) {
  std::vector<float> w = {127.0f, -64.0f, 0.5f, 1.5f};
  auto q = run(w, 4, 1, 0, QuantSpec{8, 4, false});
  EXPECT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(signed_codes(q), (std::vector<int>{127, -64, 0, 2}));
}

TEST(Rtn, TransposedLayoutEqualsMatMulLayout) {
  // The same weight stored [K, N] (MatMul) and [N, K] (Gemm transB) quantizes to the same
  // blocks along K: codes transpose, scales [G, N] vs [N, G].
  const int64_t K = 40, N = 6, bs = 16;
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  std::vector<float> kn(size_t(K * N)), nk(size_t(K * N));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) nk[size_t(n * K + k)] = kn[size_t(k * N + n)] = d(rng);
  for (bool zp : {false, true}) {
    auto a = run(kn, K, N, 0, QuantSpec{4, bs, zp});
    auto b = run(nk, N, K, 1, QuantSpec{4, bs, zp});
    ASSERT_EQ(a.groups, 3);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) ASSERT_EQ(a.codes[size_t(k * N + n)], b.codes[size_t(n * K + k)]);
    for (int64_t g = 0; g < 3; ++g)
      for (int64_t n = 0; n < N; ++n) ASSERT_EQ(a.scales[size_t(g * N + n)], b.scales[size_t(n * 3 + g)]);
    EXPECT_DOUBLE_EQ(a.sq_error, b.sq_error);
  }
}

TEST(Rtn, CodesStayInRangeAndErrorIsBounded) {
  const int64_t K = 300, N = 33, bs = 32;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-3, 3);
  std::vector<float> w(size_t(K * N));
  for (auto& v : w) v = d(rng);
  auto q = run(w, K, N, 0, QuantSpec{4, bs, false});
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const int c = int8_t(q.codes[size_t(k * N + n)]);
      ASSERT_GE(c, -7);  // amax/7 never reaches -8 without clipping
      ASSERT_LE(c, 7);
      // Round to nearest: error at most half a step.
      const float s = q.scales[size_t((k / bs) * N + n)];
      ASSERT_LE(std::fabs(w[size_t(k * N + n)] - c * s), 0.5f * s * (1 + 1e-6f));
    }
}

TEST(Rtn, SameResultWhateverTheThreadCount) {
  const int64_t K = 4096 + 17, N = 2500;
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<float> w(size_t(K * N));
  for (auto& v : w) v = d(rng);
  set_num_threads(1);
  auto a = run(w, K, N, 0, QuantSpec{4, 128, true});
  set_num_threads(5);
  auto b = run(w, K, N, 0, QuantSpec{4, 128, true});
  set_num_threads(0);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.zero_points, b.zero_points);
  EXPECT_EQ(a.sq_error, b.sq_error);  // bitwise: partial sums are added in a fixed order
}

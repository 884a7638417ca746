// Each fast CPU kernel against its plain scalar reference: bit for bit where the arithmetic is the
// same (weighted RTN on either stored layout, the Gram clip search's codes, scales and choices), within
// a stated bound where only the summation order differs (the AWQ loss in its GEMM and Cholesky forms,
// the Cholesky factor).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/awq_fast.h"
#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/clip_fast.h"
#include "kernels/cpu/clip_ref.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_ref.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

// A weight of logical shape [K, N] stored as k_axis says, in dtype t (bytes owned by the struct).
struct TestWeight {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightMatrix w;
};

TestWeight make_weight(DType t, int64_t K, int64_t N, int k_axis, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  TestWeight tw;
  tw.f32.resize(size_t(K * N));
  for (auto& v : tw.f32) v = d(rng);
  tw.w = WeightMatrix{t, nullptr, k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
  if (t != DType::kFloat32) {
    tw.half.resize(tw.f32.size());
    for (size_t i = 0; i < tw.f32.size(); ++i)
      tw.half[i] = t == DType::kFloat16 ? float_to_half(tw.f32[i]) : float_to_bf16(tw.f32[i]);
    tw.w.data = tw.half.data();
  } else {
    tw.w.data = tw.f32.data();
  }
  return tw;
}

// XᵀX of T random token rows with channel scales 1..5 (positive definite for T >> K).
std::vector<double> make_gram(int64_t T, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(size_t(T * K)), g(size_t(K * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) x[size_t(t * K + k)] = d(rng) * (1.0 + double(k % 5));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) g[size_t(i * K + j)] += x[size_t(t * K + i)] * x[size_t(t * K + j)];
  return g;
}

// The block-diagonal of g as [G, B, B], the last block zero-padded (as calibration keeps it).
std::vector<double> block_diagonal(const std::vector<double>& g, int64_t K, int64_t B) {
  const int64_t G = num_blocks(K, B);
  std::vector<double> out(size_t(G * B * B), 0.0);
  for (int64_t b = 0; b < G; ++b)
    for (int64_t i = 0; i < B && b * B + i < K; ++i)
      for (int64_t j = 0; j < B && b * B + j < K; ++j)
        out[size_t((b * B + i) * B + j)] = g[size_t((b * B + i) * K + b * B + j)];
  return out;
}

const char* name(DType t) { return t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16"; }

}  // namespace

TEST(FastVsRef, WeightedRtnOnBothLayouts) {
  const std::vector<float> ratios = {1.0f, 0.95f, 0.9f, 0.8f, 0.6f};
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int k_axis : {0, 1})
      for (bool zp : {false, true}) {
        const int64_t K = 200, N = 72;  // a partial last block of 64
        TestWeight tw = make_weight(t, K, N, k_axis, 7);
        std::vector<float> energy(static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k) energy[size_t(k)] = 0.1f + float(k % 7);
        const QuantSpec spec{4, 64, zp};
        QuantResult ref, fast;
        rtn_quantize_weighted(tw.w, spec, energy.data(), ratios, ref);
        rtn_quantize_weighted_fast(tw.w, spec, energy.data(), ratios, fast);
        SCOPED_TRACE(std::string(name(t)) + " k_axis " + std::to_string(k_axis) + (zp ? " zp" : " sym"));
        EXPECT_EQ(ref.codes, fast.codes);
        EXPECT_EQ(ref.scales, fast.scales);
        EXPECT_EQ(ref.zero_points, fast.zero_points);
        EXPECT_DOUBLE_EQ(ref.sq_error, fast.sq_error);
      }
}

// The residuals are the same arithmetic in both; the block losses are summed in float64 by the
// reference and by sgemm in float32 by the fast kernel, so a block could only choose differently
// where two candidates tie to float32 rounding: none does on these inputs.
TEST(FastVsRef, GramClipSearchSameChoices) {
  const int64_t K = 200, N = 40, B = 64;
  const std::vector<double> g = make_gram(600, K, 3);
  const std::vector<double> gb = block_diagonal(g, K, B);
  std::vector<float> inv_s(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) inv_s[size_t(k)] = 1.0f / (0.5f + 0.01f * float(k));
  GramClipOptions opt;
  opt.ratios = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.7f, 0.6f, 0.5f};
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int k_axis : {0, 1})
      for (bool zp : {false, true})
        for (bool blocked : {false, true})
          for (bool scaled : {false, true}) {
            TestWeight tw = make_weight(t, K, N, k_axis, 11);
            const QuantSpec spec{4, B, zp};
            QuantResult ref, fast;
            std::vector<float> ref_r, fast_r;
            const double* gram = blocked ? gb.data() : g.data();
            const float* is = scaled ? inv_s.data() : nullptr;
            clip_quantize_gram_ref(tw.w, spec, gram, blocked ? B : 0, is, opt, ref, &ref_r);
            clip_quantize_gram(tw.w, spec, gram, blocked ? B : 0, is, opt, fast, &fast_r);
            SCOPED_TRACE(std::string(name(t)) + " k_axis " + std::to_string(k_axis) + (zp ? " zp" : " sym") +
                         (blocked ? " block-diagonal" : " full") + (scaled ? " 1/s" : ""));
            EXPECT_EQ(ref_r, fast_r);
            EXPECT_EQ(ref.codes, fast.codes);
            EXPECT_EQ(ref.scales, fast.scales);
            EXPECT_EQ(ref.zero_points, fast.zero_points);
            EXPECT_NEAR(ref.sq_error, fast.sq_error, 1e-9 * ref.sq_error);
            // Not every block keeps ratio 1: the search is exercised.
            int clipped = 0;
            for (float r : ref_r) clipped += r != 1.0f;
            EXPECT_GT(clipped, 0);
          }
}

// float32 BLAS against the float64 reference: relative difference below 1e-4 (K = 300 products of
// float32 values summed in float32 by sgemm/strmm, in float64 by the reference).
TEST(FastVsRef, AwqLossFormsWithinBound) {
  const int64_t K = 300, N = 70, T = 500;
  const std::vector<double> g = make_gram(T, K, 5);
  const std::vector<float> g32(g.begin(), g.end());
  const std::vector<float> u = gram_cholesky_upper(g.data(), K);
  ASSERT_FALSE(u.empty());
  std::vector<float> s(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) s[size_t(k)] = 0.5f + 0.02f * float(k % 50);
  const std::vector<float> ratios = {1.0f, 0.9f, 0.8f};
  for (DType t : {DType::kFloat32, DType::kFloat16})
    for (int k_axis : {0, 1})
      for (bool zp : {false, true})
        for (const std::vector<float>* clip : {static_cast<const std::vector<float>*>(nullptr), &ratios}) {
          TestWeight tw = make_weight(t, K, N, k_axis, 13);
          const QuantSpec spec{4, 128, zp};
          const double ref = awq_loss_ref(tw.w, s.data(), spec, g32.data(), T, clip);
          const std::vector<float> w_kn = logical_weight(tw.w);
          const double gemm = awq_loss(tw.w, w_kn, s.data(), spec, g32.data(), T, clip);
          const double tri = awq_loss(tw.w, w_kn, s.data(), spec, g32.data(), T, clip, u.data());
          SCOPED_TRACE(std::string(name(t)) + " k_axis " + std::to_string(k_axis) + (zp ? " zp" : " sym") +
                       (clip ? " clip" : ""));
          ASSERT_GT(ref, 0.0);
          EXPECT_NEAR(gemm / ref, 1.0, 1e-4);
          EXPECT_NEAR(tri / ref, 1.0, 1e-4);
        }
}

TEST(FastVsRef, CholeskyFactorWithinBound) {
  const int64_t K = 90;
  const std::vector<double> g = make_gram(300, K, 17);
  const std::vector<float> ref = gram_cholesky_upper_ref(g.data(), K);
  const std::vector<float> fast = gram_cholesky_upper(g.data(), K);
  ASSERT_EQ(ref.size(), size_t(K * K));
  ASSERT_EQ(fast.size(), size_t(K * K));
  float umax = 0;
  for (float v : ref) umax = std::max(umax, std::fabs(v));
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(ref[i], fast[i], 1e-5f * umax) << i;
  // Nothing to factor: both give up the same way.
  std::vector<double> z(size_t(K * K), 0.0);
  EXPECT_TRUE(gram_cholesky_upper_ref(z.data(), K).empty());
}

// QuantResult::pack: the codes straight into their ONNX INT4 bytes, on every instruction set this CPU has,
// in the kernel ([K, N] with N even: several column tiles and a partial one) and after it (N odd, [N, K]);
// the scales and the error do not change, and no byte-a-code array is left.
TEST(FastVsRef, PlainRtnWritesPackedCodes) {
  for (RtnIsa isa : rtn_fast_isas()) {
    rtn_fast_force_isa(isa);
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (int k_axis : {0, 1})
        for (int64_t N : {int64_t(2 * 1024 + 6), int64_t(37)})
          for (bool zp : {false, true})
            for (RtnArithmetic how : {RtnArithmetic::kModelOpt, RtnArithmetic::kOnnxRuntime}) {
              TestWeight tw = make_weight(t, 200, N, k_axis, 11);
              QuantSpec spec{4, 64, zp};
              spec.rtn_arithmetic = how;
              QuantResult ref, plain, packed;
              packed.pack = true;
              rtn_quantize_ref(tw.w, spec, ref);
              rtn_quantize_fast(tw.w, spec, plain);
              rtn_quantize_fast(tw.w, spec, packed);
              SCOPED_TRACE(std::string(rtn_isa_name(isa)) + " " + name(t) + " k_axis " + std::to_string(k_axis) +
                           " N " + std::to_string(N) + (zp ? " zp" : " sym"));
              ASSERT_EQ(ref.codes, plain.codes);
              EXPECT_TRUE(packed.codes.empty());
              EXPECT_EQ(packed.packed, pack_onnx(ref.codes, 4));
              EXPECT_EQ(packed.scales, plain.scales);
              EXPECT_EQ(packed.zero_points, plain.zero_points);
              EXPECT_EQ(packed.sq_error, plain.sq_error);
            }
  }
  rtn_fast_force_isa(RtnIsa::kAuto);
}

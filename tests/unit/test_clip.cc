// AWQ clip kernels (kernels/cpu/clip_ref.h): ModelOpt's ratio grid, the Gram-form block search
// against the diagonal-weighted search it generalises, layouts and thread-count independence.
#include <gtest/gtest.h>

#include <random>

#include "host/algo/awq_clip.h"
#include "kernels/cpu/clip_fast.h"
#include "kernels/cpu/clip_ref.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

std::vector<float> random_weight(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(size_t(n), 0.0f);
  for (auto& v : w) v = d(rng);
  w[3] = 0.9f;  // outliers: clipping has something to gain
  w[77] = -0.7f;
  return w;
}

}  // namespace

TEST(Clip, ModelOptRatioGrid) {
  // [round(r, 2) for r in np.arange(0.5, 1.0, 0.05)] + [1.0]
  const auto r = clip_ratio_grid(0.05, 0.5);
  const std::vector<double> want = {0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0};
  ASSERT_EQ(r, want);
  // np.arange(0.3, 1.0, 0.1) -> 0.3 .. 0.9 (7 values, 0.3+6*0.1 = 0.8999999999999999)
  EXPECT_EQ(clip_ratio_grid(0.1, 0.3).size(), 8u);
  EXPECT_EQ(clip_ratio_grid(0.5, 1.0), std::vector<double>{1.0});
}

TEST(Clip, IdentityGramEqualsUnitWeightedSearch) {
  // With G = I the block loss is sum (w - ŵ)^2: clip_quantize_gram must pick what
  // rtn_quantize_weighted picks with unit weights, for both layouts and zero point.
  const int64_t K = 200, N = 24;  // K not a multiple of the block
  const auto w = random_weight(K * N, 7);
  std::vector<double> eye(size_t(K * K), 0.0);
  for (int64_t k = 0; k < K; ++k) eye[size_t(k * K + k)] = 1.0;
  const std::vector<float> ones(size_t(K), 1.0f);
  GramClipOptions opt;
  opt.ratios = {1.0f, 0.95f, 0.9f, 0.8f, 0.7f, 0.6f, 0.5f};
  for (int k_axis : {0, 1})
    for (bool zp : {false, true}) {
      WeightMatrix m{DType::kFloat32, w.data(), k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
      QuantSpec spec{4, 32, zp};
      QuantResult a, b;
      clip_quantize_gram(m, spec, eye.data(), 0, nullptr, opt, a);
      rtn_quantize_weighted(m, spec, ones.data(), opt.ratios, b);
      EXPECT_EQ(a.codes, b.codes) << k_axis << zp;
      EXPECT_EQ(a.scales, b.scales) << k_axis << zp;
      EXPECT_EQ(a.zero_points, b.zero_points) << k_axis << zp;
      EXPECT_NEAR(a.sq_error, b.sq_error, 1e-12 * b.sq_error);  // summed in another order
    }
}

TEST(Clip, RatiosOfOneAreRtnAndThreadsDoNotMatter) {
  const int64_t K = 96, N = 40;
  const auto w = random_weight(K * N, 11);
  WeightMatrix m{DType::kFloat32, w.data(), K, N, 0};
  QuantSpec spec{4, 32, false};
  const int64_t G = 3;
  std::vector<float> ones(size_t(N * G), 1.0f);
  QuantResult a, b;
  rtn_quantize_ratios(m, spec, ones.data(), a);
  rtn_quantize_ref(m, spec, b);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);

  // token sample: the search is deterministic whatever the thread count
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(size_t(64 * K));
  for (auto& v : x) v = d(rng);
  set_num_threads(1);
  const auto r1 = clip_search_modelopt(m, spec, x.data(), 64, clip_ratio_grid(0.05, 0.5));
  set_num_threads(3);
  const auto r3 = clip_search_modelopt(m, spec, x.data(), 64, clip_ratio_grid(0.05, 0.5));
  set_num_threads(0);
  EXPECT_EQ(r1, r3);
  int clipped = 0;
  for (float r : r1) clipped += r != 1.0f;
  EXPECT_GT(clipped, 0);
}

TEST(Clip, BlockDiagonalGramEqualsFullGram) {
  // calib/capture.py --gram_block B keeps only [G, B, B]: the search reads nothing else.
  const int64_t K = 100, N = 20, B = 32, G = 4;
  const auto w = random_weight(K * N, 3);
  std::mt19937 rng(9);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> x(size_t(50 * K));
  for (auto& v : x) v = d(rng);
  std::vector<double> full(size_t(K * K), 0.0), blocks(size_t(G * B * B), 0.0);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) {
      double s = 0;
      for (int64_t t = 0; t < 50; ++t) s += x[size_t(t * K + i)] * x[size_t(t * K + j)];
      full[size_t(i * K + j)] = s;
      if (i / B == j / B) blocks[size_t(((i / B) * B + i % B) * B + j % B)] = s;
    }
  std::vector<float> inv(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) inv[size_t(k)] = 1.0f / (0.5f + float(k % 7) * 0.25f);
  GramClipOptions opt;
  opt.ratios = {1.0f, 0.9f, 0.8f, 0.7f};
  WeightMatrix m{DType::kFloat32, w.data(), K, N, 0};
  QuantSpec spec{4, B, false};
  QuantResult a, b;
  std::vector<float> ca, cb;
  clip_quantize_gram(m, spec, full.data(), 0, inv.data(), opt, a, &ca);
  clip_quantize_gram(m, spec, blocks.data(), B, inv.data(), opt, b, &cb);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(ca, cb);
  int clipped = 0;
  for (float r : ca) clipped += r != 1.0f;
  EXPECT_GT(clipped, 0);
}

// A Gram matrix holding NaN or inf (an activation that overflowed): no candidate's loss beats +inf,
// so every block must keep candidate 0 (the first ratio, positive scale), never an unset scale of 1.
TEST(Clip, NonFiniteGramKeepsCandidateZero) {
  const int64_t K = 64, N = 8, B = 32;
  const auto w = random_weight(K * N, 13);
  GramClipOptions opt;
  opt.ratios = {1.0f, 0.9f, 0.8f};
  opt.both_signs = true;
  for (double bad : {double(NAN), double(INFINITY)})
    for (bool zp : {false, true}) {
      std::vector<double> gram(size_t(K * K), 0.0);
      for (int64_t k = 0; k < K; ++k) gram[size_t(k * K + k)] = 1.0;
      for (int64_t k = 0; k < K; k += B) gram[size_t(k * K + k)] = bad;  // one bad entry per block
      WeightMatrix m{DType::kFloat32, w.data(), K, N, 0};
      QuantSpec spec{4, B, zp};
      for (bool reference : {false, true}) {
      QuantResult q;
      std::vector<float> chosen;
      if (reference) clip_quantize_gram_ref(m, spec, gram.data(), 0, nullptr, opt, q, &chosen);
      else clip_quantize_gram(m, spec, gram.data(), 0, nullptr, opt, q, &chosen);
      for (int64_t g = 0; g < K / B; ++g)
        for (int64_t n = 0; n < N; ++n) {
          float amax = 0, mn = INFINITY, mx = -INFINITY;
          for (int64_t k = g * B; k < (g + 1) * B; ++k) {
            const float v = w[size_t(k * N + n)];
            amax = std::max(amax, std::fabs(v));
            mn = std::min(mn, v);
            mx = std::max(mx, v);
          }
          const BlockParams p0 =
              zp ? block_params_zero_point(mn, mx, 4, DType::kFloat32) : block_params_symmetric(amax, 4, DType::kFloat32);
          ASSERT_EQ(q.scales[size_t(g * N + n)], p0.scale) << bad << zp << " " << g << "," << n;
          if (zp) {
            ASSERT_EQ(q.zero_points[size_t(g * N + n)], p0.zero_point);
          }
          ASSERT_EQ(chosen[size_t(n * (K / B) + g)], 1.0f) << (reference ? "reference" : "fast");
        }
      }
    }
}

// The candidate step every search shares (kernels/clip_candidate.h): ratio r of the symmetric scale
// amax / 7 (INT4) or of the range [mn, mx], the scale negated for the second half of the candidates.
TEST(Clip, CandidateStepScalesTheBlockAndNegatesTheSecondHalf) {
  const std::vector<float> ratios = {1.0f, 0.5f};
  const float amax = 3.5f, mn = -1.5f, mx = 3.0f;
  EXPECT_EQ(clip_candidate(ratios, 0, amax, mn, mx, 4, false, DType::kFloat32).scale, 0.5f);
  EXPECT_EQ(clip_candidate(ratios, 1, amax, mn, mx, 4, false, DType::kFloat32).scale, 0.25f);
  EXPECT_EQ(clip_candidate(ratios, 2, amax, mn, mx, 4, false, DType::kFloat32).scale, -0.5f);
  EXPECT_EQ(clip_candidate(ratios, 3, amax, mn, mx, 4, false, DType::kFloat32).scale, -0.25f);
  // Zero point, ratio 0.5: range [-0.75, 1.5], scale 2.25 / 15 = 0.15, z = -rint(-0.75 / 0.15) = 5.
  const BlockParams z = clip_candidate(ratios, 1, amax, mn, mx, 4, true, DType::kFloat32);
  EXPECT_EQ(z.scale, 2.25f / 15.0f);
  EXPECT_EQ(z.zero_point, 5);
  // The shared step is the block formulas at r·amax, the scale rounded to the scale type (fp16 here).
  const BlockParams h = clip_candidate(ratios, 1, 0.3f, 0, 0, 4, false, DType::kFloat16);
  EXPECT_EQ(h.scale, block_params_symmetric(0.5f * 0.3f, 4, DType::kFloat16).scale);
  EXPECT_EQ(h.scale, round_to(DType::kFloat16, 0.15f / 7.0f));
}

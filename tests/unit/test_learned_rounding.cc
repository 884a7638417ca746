// Learned rounding (kernels/learned_rounding.h through the reference and CPU backends): the objective it
// reports against the definition computed here, and the drop from GPTQ's codes it exists for.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/cpu_backend.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

constexpr int64_t kK = 96, kN = 40, kBlock = 32;

// X [T, K] with a shared component and a few loud channels, as GPTQ's test builds it; channel `dead` silent.
std::vector<double> make_gram(int64_t T, uint32_t seed, int64_t dead, int64_t K = kK) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(size_t(T * K)), g(size_t(K * K), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double common = d(rng);
    for (int64_t k = 0; k < K; ++k)
      x[size_t(t * K + k)] = k == dead ? 0.0 : (0.6 * common + d(rng)) * (k % 13 == 5 ? 6.0 : 1.0);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) g[size_t(i * K + j)] += x[size_t(t * K + i)] * x[size_t(t * K + j)];
  return g;
}

// `count` weights drawn from N(0, 0.05²).
std::vector<float> normal_weights(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(count));
  for (float& v : w) v = d(rng);
  return w;
}

// Σ_n e_n H e_nᵀ, H = diag(s) G diag(s) + damp·I with damp = percdamp · mean diag, straight from its
// definition on the dequantized codes.
double objective(const std::vector<float>& w, const WeightMatrix& m, const QuantSpec& spec, const QuantResult& q,
                 const std::vector<double>& g, const std::vector<float>& s, double percdamp) {
  double mean = 0;
  for (int64_t k = 0; k < kK; ++k) mean += g[size_t(k * kK + k)] * double(s[k]) * double(s[k]);
  const double damp = percdamp * mean / double(kK);
  const int64_t G = num_blocks(kK, spec.block);
  double total = 0;
  for (int64_t n = 0; n < kN; ++n) {
    std::vector<double> e(static_cast<size_t>(kK));
    for (int64_t k = 0; k < kK; ++k) {
      const float sc = q.scales[m.param_index(G, k / spec.block, n)];
      const int level = spec.zero_point ? int(q.codes[m.index(k, n)]) - int(q.zero_points[m.param_index(G, k / spec.block, n)])
                                        : int(int8_t(q.codes[m.index(k, n)]));
      e[size_t(k)] = double(w[m.index(k, n)]) - double(float(level) * sc);
    }
    for (int64_t i = 0; i < kK; ++i)
      for (int64_t j = 0; j < kK; ++j)
        total += e[size_t(i)] * e[size_t(j)] * (g[size_t(i * kK + j)] * double(s[i]) * double(s[j]) + (i == j ? damp : 0.0));
  }
  return total;
}

struct Quantized {
  QuantResult gptq, learned;
  LearnedRoundingStats stats;
};

Quantized run(Backend& b, const WeightMatrix& m, const QuantSpec& spec,
        const std::vector<double>& g, const std::vector<float>& inv_s, const LearnedRoundingOptions& opt) {
  Quantized r;
  GptqOptions gopt;
  gopt.ratios = {1.0f, 0.95f, 0.9f, 0.85f};
  const Tensor gram = host_view(DType::kFloat64, {kK, kK}, g.data());
  b.gptq_quantize(m, spec, b.gptq_factor(gram, inv_s.data(), opt.percdamp, false), gopt, r.gptq);
  r.learned = r.gptq;
  r.stats = b.learned_rounding(m, spec, gram, inv_s.data(), opt, r.learned);
  return r;
}

class LearnedRounding : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(LearnedRounding, LowersGptqsOutputErrorAndReportsItExactly) {
  const auto [zero_point, k_axis] = GetParam();
  const std::vector<float> w = normal_weights(kK * kN, 7);
  const WeightMatrix m{DType::kFloat32, w.data(), k_axis == 0 ? kK : kN, k_axis == 0 ? kN : kK, k_axis, {}};
  QuantSpec spec;
  spec.block = kBlock;
  spec.zero_point = zero_point;
  const auto g = make_gram(160, 11, 17);
  std::vector<float> inv_s(static_cast<size_t>(kK));
  for (int64_t k = 0; k < kK; ++k) inv_s[size_t(k)] = 0.6f + 0.01f * float(k % 50);
  const auto ref_backend = make_reference_backend();
  const auto cpu_backend = make_cpu_backend();
  for (int iters : {0, 40}) {  // greedy sweeps only (the default), and sign steps before them
    LearnedRoundingOptions opt;
    opt.iters = iters;
    opt.lr = 0.02;
    const Quantized a = run(*ref_backend, m, spec, g, inv_s, opt);
    const double given = objective(w, m, spec, a.gptq, g, inv_s, opt.percdamp);
    const double learned = objective(w, m, spec, a.learned, g, inv_s, opt.percdamp);
    EXPECT_NEAR(a.stats.objective_given, given, 1e-9 * given);
    EXPECT_NEAR(a.stats.objective_learned, learned, 1e-9 * given);
    // Measured: 0.86-0.89 of GPTQ's objective over these four cases.
    EXPECT_LT(learned, 0.93 * given) << iters;
    EXPECT_GT(a.stats.moved, 0);
    EXPECT_EQ(a.learned.scales, a.gptq.scales);
    EXPECT_EQ(a.learned.zero_points, a.gptq.zero_points);
    // The threaded kernel from the same GPTQ codes: the reference's bits.
    QuantResult threaded = a.gptq;
    const LearnedRoundingStats st = cpu_backend->learned_rounding(m, spec, host_view(DType::kFloat64, {kK, kK}, g.data()), inv_s.data(), opt,
                                                                    threaded);
    EXPECT_EQ(threaded.codes, a.learned.codes);
    EXPECT_EQ(st.objective_learned, a.stats.objective_learned);
    EXPECT_EQ(threaded.sq_error, a.learned.sq_error);
  }
}

// The threaded kernel's tiles (16 rows, 512 channels, four rows of G at a time) on a shape none of them
// divides, with sign steps large enough that the restore takes rows back to earlier codes and their
// residuals are computed again: the reference's bits.
TEST(LearnedRoundingTiles, MatchTheReferenceOnAnOddShape) {
  constexpr int64_t K = 523, N = 37;
  const std::vector<float> w = normal_weights(K * N, 5);
  const WeightMatrix m{DType::kFloat32, w.data(), K, N, 0, {}};
  QuantSpec spec;
  spec.block = kBlock;
  const auto g = make_gram(600, 13, 101, K);
  std::vector<float> inv_s(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) inv_s[size_t(k)] = 0.6f + 0.01f * float(k % 50);
  const Tensor gram = host_view(DType::kFloat64, {K, K}, g.data());
  const auto ref_backend = make_reference_backend();
  const auto cpu_backend = make_cpu_backend();
  for (int iters : {0, 8}) {
    LearnedRoundingOptions opt;
    opt.iters = iters;
    opt.lr = 0.2;
    QuantResult given;
    GptqOptions gopt;
    ref_backend->gptq_quantize(m, spec, ref_backend->gptq_factor(gram, inv_s.data(), opt.percdamp, false), gopt, given);
    QuantResult a = given, b = given;
    const LearnedRoundingStats sa = ref_backend->learned_rounding(m, spec, gram, inv_s.data(), opt, a);
    const LearnedRoundingStats sb = cpu_backend->learned_rounding(m, spec, gram, inv_s.data(), opt, b);
    EXPECT_GT(sa.moved, 0) << iters;
    EXPECT_EQ(a.codes, b.codes) << iters;
    EXPECT_EQ(sa.objective_given, sb.objective_given) << iters;
    EXPECT_EQ(sa.objective_learned, sb.objective_learned) << iters;
    EXPECT_EQ(sa.moved, sb.moved) << iters;
    EXPECT_EQ(a.sq_error, b.sq_error) << iters;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LearnedRounding,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1)));

// Without sign steps or sweeps nothing moves; a dead channel's codes never move.
TEST(LearnedRoundingEdges, NoStepsKeepTheCodesAndDeadChannelsStay) {
  const std::vector<float> w = normal_weights(kK * kN, 3);
  const WeightMatrix m{DType::kFloat32, w.data(), kK, kN, 0, {}};
  QuantSpec spec;
  spec.block = kBlock;
  const auto g = make_gram(160, 5, 17);
  const std::vector<float> ones(static_cast<size_t>(kK), 1.0f);
  const auto b = make_reference_backend();
  LearnedRoundingOptions none;
  none.iters = 0, none.polish_sweeps = 0;
  const Quantized still = run(*b, m, spec, g, ones, none);
  EXPECT_EQ(still.learned.codes, still.gptq.codes);
  EXPECT_EQ(still.stats.moved, 0);
  EXPECT_EQ(still.stats.objective_learned, still.stats.objective_given);
  const Quantized moved = run(*b, m, spec, g, ones, LearnedRoundingOptions{});
  for (int64_t n = 0; n < kN; ++n) EXPECT_EQ(moved.learned.codes[m.index(17, n)], moved.gptq.codes[m.index(17, n)]);
}

}  // namespace

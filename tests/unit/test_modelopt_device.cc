// ModelOpt mode's clip search and joint weight statistic on the emulated CUDA backend: the CPU
// backend's bits (fp32 and fp16 weights, both layouts, partial blocks, token counts that divide
// nothing, column chunks of one column), and what crosses the bus (the ledger).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

std::unique_ptr<Backend> emulated(uint64_t budget = uint64_t(64) << 20) {
  return make_backend(BackendOptions{Device::kCudaEmulated, budget}, nullptr);
}

OpTransfers op(const Backend& b, const std::string& name) {
  const auto it = b.transfer_ledger()->ops.find(name);
  return it == b.transfer_ledger()->ops.end() ? OpTransfers{} : it->second;
}

// A weight [K, N] (k_axis 0) or [N, K] (k_axis 1) of dtype t with outliers, constant and zero columns.
struct Weight {
  std::vector<uint8_t> bytes;
  WeightMatrix m;
  Weight(DType t, int64_t K, int64_t N, int k_axis, uint32_t seed) : bytes(size_t(K * N) * dtype_size(t)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.05f);
    m = WeightMatrix{t, bytes.data(), k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        float v = d(rng);
        if (n == 2) v = 0.0f;
        if (n == 4) v = 0.125f;
        if ((k * 13 + n) % 71 == 0) v *= -9.0f;
        store_float(t, bytes.data(), m.index(k, n), round_to(t, v));
      }
  }
  uint64_t size() const { return bytes.size(); }
};

std::vector<float> tokens(int64_t T, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(size_t(T * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = d(rng) * (rng() % 4 == 0 ? 1000.0f : 1.0f);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::vector<double> kRatios = {0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0};

}  // namespace

// Every combination against the CPU backend, bit for bit: bsz_col 16 (< N, chunks of several
// columns), 40 (the last chunk is one column: pairwise sums there), 1 (every column pairwise) and
// 1024; K = 200 with block 64 (a partial last block) and K = 48 < block (G = 1: pairwise token means);
// T = 1 and 37 tokens (101 in the ledger test below).
TEST(ModeloptDevice, ClipSearchEqualsTheCpuBackend) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto cpu = make_cpu_backend();
  auto gpu = emulated();
  int clipped = 0;
  for (DType t : {DType::kFloat32, DType::kFloat16})
    for (int k_axis : {0, 1})
      for (int64_t K : {int64_t(200), int64_t(48)})
        for (int64_t T : {int64_t(1), int64_t(37)}) {
          const int64_t N = 41;
          const Weight w(t, K, N, k_axis, uint32_t(K + T + k_axis));
          const std::vector<float> x = tokens(T, K, uint32_t(T));
          QuantSpec spec;
          spec.bits = 4;
          spec.block = 64;
          for (int64_t bsz : {int64_t(16), int64_t(40), int64_t(1), int64_t(1024)}) {
            SCOPED_TRACE(dtype_name(t) + " k_axis " + std::to_string(k_axis) + " K " + std::to_string(K) + " T " +
                         std::to_string(T) + " bsz_col " + std::to_string(bsz));
            const auto want = cpu->clip_search_modelopt(w.m, spec, x.data(), T, kRatios, bsz);
            const auto got = gpu->clip_search_modelopt(w.m, spec, x.data(), T, kRatios, bsz);
            ASSERT_EQ(want.size(), size_t(N * ((K + 63) / 64)));
            EXPECT_TRUE(same_bits(want, got));
            for (float r : want) clipped += r != 1.0f;
          }
        }
  EXPECT_GT(clipped, 1000);  // the search does choose: most blocks clip
}

// 8-bit layers search the same way (ModelOpt passes the layer's bits).
TEST(ModeloptDevice, ClipSearchEightBitEqualsTheCpuBackend) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  const Weight w(DType::kFloat16, 96, 33, 0, 3);
  const std::vector<float> x = tokens(64, 96, 4);
  QuantSpec spec;
  spec.bits = 8;
  spec.block = 96;
  const auto want = make_cpu_backend()->clip_search_modelopt(w.m, spec, x.data(), 64, kRatios, 1024);
  EXPECT_TRUE(same_bits(want, emulated()->clip_search_modelopt(w.m, spec, x.data(), 64, kRatios, 1024)));
}

// The weight and the token sample go up once (the ratios, 4 bytes each, with them); only the chosen
// ratio of each block comes back. In a budget that holds a few columns, the panels change nothing.
TEST(ModeloptDevice, ClipSearchMovesWeightAndTokensOnceAndRatiosBack) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  const int64_t K = 200, N = 41, T = 101, G = 4;
  const Weight w(DType::kFloat16, K, N, 0, 7);
  const std::vector<float> x = tokens(T, K, 8);
  QuantSpec spec;
  spec.bits = 4;
  spec.block = 64;
  const auto want = make_cpu_backend()->clip_search_modelopt(w.m, spec, x.data(), T, kRatios, 40);
  // Per column: the fp16 weight, 12 slices of [G·64] floats, [G·T] products, [11·G] losses, G choices.
  const uint64_t per_col = K * 2 + 12 * G * 64 * 4 + G * T * 4 + 11 * G * 4 + G * 4;
  for (uint64_t budget : {uint64_t(64) << 20, T * K * 4 + 8 * per_col + (64 << 10)}) {
    SCOPED_TRACE(budget);
    auto gpu = emulated(budget);
    EXPECT_TRUE(same_bits(want, gpu->clip_search_modelopt(w.m, spec, x.data(), T, kRatios, 40)));
    const OpTransfers o = op(*gpu, "clip_search_modelopt");
    EXPECT_EQ(o.h2d_bytes, w.size() + uint64_t(T * K * 4) + kRatios.size() * 4);
    EXPECT_EQ(o.d2h_bytes, uint64_t(N * G * 4));
    EXPECT_FALSE(o.host_fallback);
    EXPECT_EQ(o.flops, uint64_t(12 * G * 64 * N * (2 * T + 8)));
    EXPECT_LE(gpu->device_memory().peak, budget);
    if (budget < (uint64_t(1) << 20)) {
      EXPECT_GT(o.launches, 6u);  // more than one panel
    }
  }
}

// The joint statistic: fp32 and fp16 siblings, both layouts side by side, a kept sibling read in
// place; K < block too (the [block, -1] view's rows then span several weight rows).
TEST(ModeloptDevice, JointWeightMeanEqualsTheCpuBackend) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto cpu = make_cpu_backend();
  for (DType t : {DType::kFloat32, DType::kFloat16})
    for (int64_t K : {int64_t(192), int64_t(40)}) {
      SCOPED_TRACE(dtype_name(t) + " K " + std::to_string(K));
      const Weight a(t, K, 64, 0, 1), b(t, K, 24, 1, 2), c(t, K, 40, 0, 3);
      const std::vector<WeightMatrix> sib = {a.m, b.m, c.m};
      const auto want = cpu->awq_weight_mean_joint(sib, 128);
      ASSERT_EQ(want.size(), size_t(K));
      auto gpu = emulated();
      const WeightMatrix kept = gpu->upload_weight(b.m);
      ASSERT_TRUE(kept.buffer);
      EXPECT_TRUE(same_bits(want, gpu->awq_weight_mean_joint({a.m, kept, c.m}, 128)));
      const OpTransfers o = op(*gpu, "awq_weight_mean_joint");
      EXPECT_EQ(o.h2d_bytes, a.size() + c.size());  // the kept sibling does not cross again
      EXPECT_EQ(o.d2h_bytes, uint64_t(K * 4));
      EXPECT_FALSE(o.host_fallback);
      EXPECT_EQ(o.flops, uint64_t(3 * K * 128));
    }
  // Mixed dtypes meet in float32, as on the CPU.
  const Weight h(DType::kFloat16, 192, 64, 0, 4), f(DType::kFloat32, 192, 64, 1, 5);
  EXPECT_TRUE(same_bits(cpu->awq_weight_mean_joint({h.m, f.m}, 128), emulated()->awq_weight_mean_joint({h.m, f.m}, 128)));
  EXPECT_THROW(emulated()->awq_weight_mean_joint({h.m}, 100), std::invalid_argument);
}

// Three blocks whose choice depends on the summation order (found by search: token rows with
// outliers, so that the partial products cancel and their rounding decides between two ratios).
// Column 0 picks another ratio when the chain runs backwards; columns 1 and 2 when it runs backwards,
// fused (an FMA chain, as a GEMM would) or pairwise. With bsz_col 1 numpy's sums are pairwise: the
// CPU's choices change there, and the device's with them.
TEST(ModeloptDevice, ClipSearchFollowsTheCpuSummationOrder) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  const float x[2][16] = {
      {-0x1.4d9854p+0, -0x1.08d91cp+8, 0x1.48b19cp-1, 0x1.23abbcp-4, -0x1.c479e6p+0, -0x1.918c6ep-1, 0x1.4d3d1p-1,
       -0x1.eeed42p-1, -0x1.209ddep-3, -0x1.dc2612p+10, 0x1.289756p+0, 0x1.c397bep-2, -0x1.1a36bp+2, -0x1.1eb23cp+0,
       0x1.2bdb5cp-1, -0x1.ae95c4p-1},
      {0x1.33c06p-3, 0x1.1fc9bp+10, -0x1.443d32p-2, 0x1.53b896p+8, -0x1.e5e04ep+0, 0x1.91d79ep-5, -0x1.f47576p-1,
       -0x1.76e524p-3, -0x1.0fc7bap-6, -0x1.0ec5f2p+10, -0x1.6acffep-1, -0x1.655d58p-1, 0x1.927678p-2, -0x1.6c04cep+0,
       -0x1.1b87a6p+1, -0x1.13a8fap-1}};
  const float cols[3][16] = {
      {0x1.0327a4p-8, 0x1.8d3a14p-7, 0x1.46312cp-4, -0x1.93571ep-4, 0x1.e6a8f4p-6, -0x1.4e2b74p-5, 0x1.13aac6p-5,
       0x1.6498dep-6, -0x1.4c082ep-6, -0x1.50ef5p-9, 0x1.17e9e6p-7, -0x1.61dbb6p-6, -0x1.4c3fep-9, 0x1.ef81bap-5,
       -0x1.98a05ep-9, 0x1.067ed6p-4},
      {0x1.06e03ep-4, 0x1.e82cbap-5, 0x1.4901aep-4, 0x1.d5839ep-6, -0x1.66b71p-6, -0x1.5779e8p-6, -0x1.f83b76p-5,
       -0x1.8985dap-7, -0x1.a5fcb4p-6, 0x1.a12e2ap-10, -0x1.11350cp-6, 0x1.1f5784p-5, -0x1.709fep-6, -0x1.77d8bp-5,
       0x1.4072eap-6, 0x1.9b1656p-4},
      {0x1.074df8p-3, 0x1.986f1ap-4, -0x1.5a8ccep-7, 0x1.877406p-6, 0x1.7accccp-4, -0x1.abfbep-6, -0x1.7abc92p-5,
       -0x1.77cb3ap-6, 0x1.eb63p-8, 0x1.de95p-8, -0x1.5c2f78p-8, -0x1.927c16p-6, 0x1.d7d676p-5, -0x1.c85c7ap-6,
       -0x1.819048p-8, 0x1.2d067ap-6}};
  std::vector<float> wk(16 * 3);  // [K, N]
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 3; ++n) wk[size_t(k * 3 + n)] = cols[n][k];
  const WeightMatrix w{DType::kFloat32, wk.data(), 16, 3, 0};
  QuantSpec spec;
  spec.bits = 4;
  spec.block = 16;
  auto cpu = make_cpu_backend();
  auto gpu = emulated();
  const std::vector<float> chain = {0.7f, 0.85f, 0.75f}, pairwise = {0.7f, 0.6f, 0.9f};
  EXPECT_EQ(cpu->clip_search_modelopt(w, spec, &x[0][0], 2, kRatios, 1024), chain);
  EXPECT_EQ(gpu->clip_search_modelopt(w, spec, &x[0][0], 2, kRatios, 1024), chain);
  EXPECT_EQ(cpu->clip_search_modelopt(w, spec, &x[0][0], 2, kRatios, 1), pairwise);
  EXPECT_EQ(gpu->clip_search_modelopt(w, spec, &x[0][0], 2, kRatios, 1), pairwise);
}

// hqq on the CUDA backend (the emulated device: the kernel bodies a GPU runs, built by the host
// compiler) against the CPU backend, bit for bit: codes, scales, integer and float zero points and the
// error sum, for fp32, fp16 and bf16 weights in both layouts, K not a multiple of the block, one panel
// and several. And what crosses the bus: the weight once, the results back, nothing run on the host.
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

// A weight of type t, logical [K, N], stored as k_axis says: Gaussian with outliers, one column
// constant, one zero and one far from 0 and narrow (the fits' special cases).
struct Weight {
  std::vector<uint8_t> bytes;
  WeightMatrix m;
  Weight(DType t, int64_t K, int64_t N, int k_axis, uint32_t seed) : bytes(size_t(K * N) * dtype_size(t)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.02f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    m = WeightMatrix{t, bytes.data(), k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) {
        float v = d(rng) * (u(rng) < 0.01f ? 8.0f : 1.0f) + 0.001f;
        if (n == 1) v = 0.0f;
        if (n == 2) v = 0.125f;
        if (n == 3) v = 3.0f + 0.01f * d(rng);
        store_float(t, bytes.data(), m.index(k, n), round_to(t, v));
      }
  }
};

uint64_t bits_of(double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  return u;
}

std::string same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ";
  if (!a.empty() && std::memcmp(a.data(), b.data(), a.size() * 4) != 0) return std::string(what) + " differ";
  return {};
}

void expect_identical(const QuantResult& want, const QuantResult& got) {
  EXPECT_EQ(want.groups, got.groups);
  EXPECT_EQ(want.codes, got.codes);
  EXPECT_EQ(same_bits(want.scales, got.scales, "scales"), "");
  EXPECT_EQ(want.zero_points, got.zero_points);
  EXPECT_EQ(same_bits(want.float_zero_points, got.float_zero_points, "float zero points"), "");
  EXPECT_EQ(bits_of(want.sq_error), bits_of(got.sq_error)) << want.sq_error << " " << got.sq_error;
}

struct Layout {
  int64_t K, N, block;
  int k_axis;
};

}  // namespace

TEST(HqqDevice, EqualsTheCpuBackendBitForBit) {
  auto cpu = make_cpu_backend();
  // K = 200 with blocks of 64: a last block of 8. 4-bit codes come back packed except for [K, N] with N
  // odd (13), where a row of the panel is not whole bytes.
  const Layout layouts[] = {{200, 38, 64, 0}, {200, 37, 64, 1}, {130, 13, 128, 0}, {96, 9, 32, 1}};
  int cases = 0;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (const Layout& l : layouts)
      for (int bits : {4, 8})
        for (bool float_zero_point : {false, true})
          for (bool refit : {false, true}) {
            const Weight w(t, l.K, l.N, l.k_axis, uint32_t(7 + cases));
            HqqOptions opt;
            opt.float_zero_point = float_zero_point;
            opt.refit_scale = refit;
            QuantSpec spec{bits, l.block, true};
            QuantResult want, got;
            cpu->hqq(w.m, spec, opt, want);
            emulated()->hqq(w.m, spec, opt, got);
            SCOPED_TRACE(dtype_name(t) + " K " + std::to_string(l.K) + " N " + std::to_string(l.N) + " axis " +
                         std::to_string(l.k_axis) + " bits " + std::to_string(bits) + " float_zero_point " +
                         std::to_string(float_zero_point) + " refit " + std::to_string(refit));
            expect_identical(want, got);
            EXPECT_EQ(got.float_zero_points.size(), float_zero_point ? want.scales.size() : 0u);
            ++cases;
          }
  EXPECT_EQ(cases, 3 * 4 * 2 * 2 * 2);
}

// A budget that holds a few columns at a time: the weight streams through in panels, same bits.
TEST(HqqDevice, PanelsGiveTheSameBits) {
  auto cpu = make_cpu_backend();
  for (int k_axis : {0, 1})
    for (bool float_zero_point : {false, true}) {
      const Weight w(DType::kFloat16, 512, 160, k_axis, 3);
      HqqOptions opt;
      opt.float_zero_point = float_zero_point;
      QuantResult want, got;
      auto small = emulated(256 << 10);
      cpu->hqq(w.m, QuantSpec{4, 128, true}, opt, want);
      small->hqq(w.m, QuantSpec{4, 128, true}, opt, got);
      expect_identical(want, got);
      // More than one panel ran: more launches than a single panel's few.
      EXPECT_GT(small->transfer_ledger()->ops.at("hqq").launches, 6u) << k_axis;
    }
}

// The weight goes up once; codes come back packed, scales and float zero points in fp16, the integer
// zero points and one error sum: nothing else crosses the bus, nothing runs on the host.
TEST(HqqDevice, MovesTheWeightOnceAndTheResultsBack) {
  constexpr int64_t K = 256, N = 96, B = 32, G = K / B;
  const Weight w(DType::kFloat16, K, N, 0, 11);
  for (bool float_zero_point : {false, true}) {
    auto gpu = emulated();
    HqqOptions opt;
    opt.float_zero_point = float_zero_point;
    QuantResult got, want;
    gpu->hqq(w.m, QuantSpec{4, B, true}, opt, got);
    make_cpu_backend()->hqq(w.m, QuantSpec{4, B, true}, opt, want);
    expect_identical(want, got);
    const OpTransfers t = gpu->transfer_ledger()->ops.at("hqq");
    EXPECT_EQ(t.h2d_bytes, uint64_t(K * N) * 2);
    EXPECT_EQ(t.d2h_bytes, uint64_t(K * N / 2 + G * N * 2 + G * N + (float_zero_point ? G * N * 2 : 0) + 8));
    EXPECT_FALSE(t.host_fallback);
    EXPECT_EQ(t.calls, 1u);
    EXPECT_FALSE(gpu->transfer_ledger()->total.host_fallback);
  }
}

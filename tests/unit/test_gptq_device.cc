// GPTQ on the CUDA backend, on the emulated device: the factor (H built on the device, dpotrf → dpotri →
// dpotrf through LinAlg, U kept there) and the sweep (lazy batches, the trailing update as one sgemm per
// 128-column chunk) give the CPU backend's bits, codes, scales, zero points and the error sum; sibling
// weights read one kept factor; W ⊙ s kept by AWQ is read in place; and a budget too small for the factor
// (or even for one chunk of the sweep) falls back to the host with the same results.
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
// A float64 Gram matrix as the tensor the operations take (host memory).
Tensor g64(const std::vector<double>& g, int64_t K) { return host_view(DType::kFloat64, {K, K}, g.data()); }
}  // namespace

namespace {

std::unique_ptr<Backend> emulated(uint64_t budget = uint64_t(64) << 20) {
  return make_backend(BackendOptions{Device::kCudaEmulated, budget}, nullptr);
}

OpTransfers op(const Backend& b, const std::string& name) {
  const auto& ops = b.transfer_ledger()->ops;
  const auto it = ops.find(name);
  return it == ops.end() ? OpTransfers{} : it->second;
}

// XᵀX of T token rows with correlated channels, a few loud ones, and channel `dead` never active.
std::vector<double> make_gram(int64_t K, int64_t T, uint32_t seed, int64_t dead) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(size_t(T * K));
  for (int64_t t = 0; t < T; ++t) {
    const double common = d(rng);
    for (int64_t k = 0; k < K; ++k)
      x[size_t(t * K + k)] = k == dead ? 0.0 : (0.6 * common + d(rng)) * (k % 17 == 3 ? 8.0 : 1.0);
  }
  std::vector<double> g(size_t(K * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) g[size_t(i * K + j)] += x[size_t(t * K + i)] * x[size_t(t * K + j)];
  return g;
}

// A weight of `dtype` in the stored layout of k_axis, with an outlier.
struct Weight {
  std::vector<float> f;
  std::vector<uint16_t> h;
  WeightMatrix m;
  Weight(DType t, int64_t K, int64_t N, int k_axis, uint32_t seed) : f(size_t(K * N)), h(size_t(K * N)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = i % 101 == 7 ? 0.6f : d(rng);
      h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
    }
    const void* data = t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data();
    m = WeightMatrix{t, data, k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
  }
  uint64_t bytes() const { return uint64_t(m.rows * m.cols) * dtype_size(m.dtype); }
};

void expect_same(const QuantResult& want, const QuantResult& got) {
  EXPECT_EQ(want.groups, got.groups);
  EXPECT_EQ(want.codes, got.codes);
  ASSERT_EQ(want.scales.size(), got.scales.size());
  EXPECT_EQ(0, std::memcmp(want.scales.data(), got.scales.data(), want.scales.size() * 4)) << "scales";
  EXPECT_EQ(want.zero_points, got.zero_points);
  EXPECT_EQ(0, std::memcmp(&want.sq_error, &got.sq_error, 8)) << want.sq_error << " vs " << got.sq_error;
}

void expect_same_channels(const GptqFactor& want, const GptqFactor& got) {
  EXPECT_EQ(want.perm, got.perm);
  EXPECT_EQ(want.energy, got.energy);
  EXPECT_EQ(want.dead, got.dead);
  EXPECT_EQ(0, std::memcmp(&want.damp, &got.damp, 8));
}

GptqOptions options(int64_t lazy) {
  GptqOptions o;
  o.ratios = {1.0f, 0.95f, 0.9f, 0.8f, 0.7f};
  o.lazy_block = lazy;
  return o;
}

struct Case {
  DType dtype;
  int k_axis, bits;
  bool zero_point;
  int64_t lazy;
};
// Each dtype, layout, width, mode and lazy batch at least twice, in different company.
const Case kCases[] = {{DType::kFloat32, 0, 4, false, 128}, {DType::kFloat16, 1, 4, true, 48},
                       {DType::kBFloat16, 0, 8, true, 128},  {DType::kFloat32, 1, 8, false, 48},
                       {DType::kFloat16, 0, 4, false, 48},  {DType::kBFloat16, 1, 4, true, 128}};

}  // namespace

// Each case against the CPU backend, bit for bit: K = 200 (blocks of 64: a partial last block),
// N = 300 (two whole 128-column chunks and a partial one), a dead channel, act order on and off, scaled
// by 1/s (awq_gptq) or not, lazy batches of 128 and of 48 (blocks fixed in the middle of a batch).
TEST(GptqDevice, EqualsTheCpuBackendBitForBit) {
  const int64_t K = 200, N = 300;
  const std::vector<double> gram = make_gram(K, 3 * K, 7, 11);
  std::vector<float> inv_s(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) inv_s[size_t(k)] = 0.5f + 0.125f * float(k % 13);
  auto cpu = make_cpu_backend();
  auto gpu = emulated();
  for (bool act_order : {false, true})
    for (bool scaled : {false, true}) {
      const float* s = scaled ? inv_s.data() : nullptr;
      const GptqFactor fc = cpu->gptq_factor(g64(gram, K), s, 0.01, act_order);
      const GptqFactor fg = gpu->gptq_factor(g64(gram, K), s, 0.01, act_order);
      SCOPED_TRACE(std::string(act_order ? "act_order" : "in order") + (scaled ? " scaled" : ""));
      expect_same_channels(fc, fg);
      EXPECT_EQ(fc.dead[11], 1);
      EXPECT_EQ(fg.upper.data, nullptr);  // U stays on the device
      ASSERT_TRUE(fg.upper.buffer);
      for (const Case& c : kCases) {
        const Weight w(c.dtype, K, N, c.k_axis, 3);
        const QuantSpec spec{c.bits, 64, c.zero_point};
        SCOPED_TRACE(dtype_name(c.dtype) + " k_axis " + std::to_string(c.k_axis) + " bits " + std::to_string(c.bits) +
                     (c.zero_point ? " zp" : " sym") + " lazy " + std::to_string(c.lazy));
        QuantResult want, got;
        cpu->gptq_quantize(w.m, spec, fc, options(c.lazy), want);
        gpu->gptq_quantize(w.m, spec, fg, options(c.lazy), got);
        expect_same(want, got);
        if (c.k_axis == 1) {  // the CPU's factor, uploaded for the sweep
          QuantResult from_host;
          gpu->gptq_quantize(w.m, spec, fc, options(c.lazy), from_host);
          expect_same(want, from_host);
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
  EXPECT_FALSE(op(*gpu, "gptq_factor").host_fallback);
  EXPECT_FALSE(op(*gpu, "gptq_quantize").host_fallback);
  EXPECT_GT(op(*gpu, "gptq_quantize").launches, 0u);
}

// One block per channel (an 8-bit layer) and a scale type other than the data's (nibble-mode AWQ).
TEST(GptqDevice, PerChannelBlocksAndFp16ScalesEqualTheCpu) {
  const int64_t K = 160, N = 130;
  const std::vector<double> gram = make_gram(K, 2 * K, 9, -1);
  auto cpu = make_cpu_backend();
  auto gpu = emulated();
  const GptqFactor fc = cpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  const GptqFactor fg = gpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  const Weight w(DType::kFloat32, K, N, 0, 4);
  for (const QuantSpec& spec : {QuantSpec{8, K, false}, QuantSpec{4, 32, true, DType::kFloat16}}) {
    QuantResult want, got;
    cpu->gptq_quantize(w.m, spec, fc, options(128), want);
    gpu->gptq_quantize(w.m, spec, fg, options(128), got);
    expect_same(want, got);
  }
}

// q, k and v read one activation: its Gram matrix goes up once, U never comes down, and each weight goes
// up once (with its O(K) list of where blocks are fixed and the candidate ratios); only packed codes,
// fp16 scales and the error sum come back.
TEST(GptqDevice, SiblingsShareOneFactorOnTheDevice) {
  const int64_t K = 256, N = 192, G = K / 64;
  const std::vector<double> gram = make_gram(K, 2 * K, 5, 3);
  auto cpu = make_cpu_backend();
  auto gpu = emulated();
  const GptqFactor fc = cpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  const GptqFactor fg = gpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  const OpTransfers f = op(*gpu, "gptq_factor");
  // The Gram matrix, and perm, positions (int64), energies (float) and dead flags for the kept factor.
  EXPECT_EQ(f.h2d_bytes, uint64_t(K * K) * 8 + uint64_t(K) * (8 + 8 + 4 + 1));
  EXPECT_EQ(f.d2h_bytes, 0u);
  EXPECT_EQ(f.flops_fp64, uint64_t(K * K * K));
  uint64_t weights = 0;
  const GptqOptions opt = options(128);
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Weight w(DType::kFloat16, K, N, 0, seed);
    weights += w.bytes();
    QuantResult want, got;
    cpu->gptq_quantize(w.m, QuantSpec{4, 64, false}, fc, opt, want);
    gpu->gptq_quantize(w.m, QuantSpec{4, 64, false}, fg, opt, got);
    expect_same(want, got);
    EXPECT_EQ(gpu->pack_onnx_codes(got, 4), cpu->pack_onnx(want.codes, 4));
  }
  const OpTransfers q = op(*gpu, "gptq_quantize");
  EXPECT_EQ(q.calls, 3u);
  EXPECT_EQ(q.h2d_bytes, weights + 3 * (uint64_t(K) * 4 + opt.ratios.size() * 4));
  EXPECT_EQ(q.d2h_bytes, 3 * (uint64_t(K * N) / 2 + uint64_t(G * N) * 2 + 8));
  EXPECT_EQ(q.flops, 3 * uint64_t(K * K * N));
  EXPECT_EQ(gpu->transfer_ledger()->total.h2d_bytes, f.h2d_bytes + q.h2d_bytes);
}

// awq_gptq: W ⊙ s stays on the device after scale_weight_f32 and the sweep reads it there.
TEST(GptqDevice, ReadsTheScaledWeightInPlace) {
  const int64_t K = 192, N = 160;
  const std::vector<double> gram = make_gram(K, 2 * K, 13, -1);
  std::vector<float> s(static_cast<size_t>(K)), inv(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) s[size_t(k)] = 0.5f + 0.25f * float(k % 7), inv[size_t(k)] = 1.0f / s[size_t(k)];
  const Weight w(DType::kFloat16, K, N, 0, 6);
  auto cpu = make_cpu_backend();
  auto gpu = emulated();
  const WeightMatrix cs = cpu->scale_weight_f32(w.m, s.data());
  const WeightMatrix gs = gpu->scale_weight_f32(w.m, s.data());
  ASSERT_EQ(gs.data, nullptr);
  QuantSpec spec{4, 32, true};
  spec.scale_dtype = DType::kFloat16;
  QuantResult want, got;
  cpu->gptq_quantize(cs, spec, cpu->gptq_factor(g64(gram, K), inv.data(), 0.01, false), options(128), want);
  gpu->gptq_quantize(gs, spec, gpu->gptq_factor(g64(gram, K), inv.data(), 0.01, false), options(128), got);
  expect_same(want, got);
  EXPECT_EQ(op(*gpu, "gptq_quantize").h2d_bytes, uint64_t(K) * 4 + 5 * 4);  // no weight: only the O(K) lists
  EXPECT_FALSE(op(*gpu, "gptq_quantize").host_fallback);
}

// A budget that holds no K x K float64 matrix: the host factors, the device sweeps in 128-column panels
// with that U uploaded once per weight. A budget too small for one chunk beside U: the host sweeps too,
// U brought back from the device's factor. The same bits either way.
TEST(GptqDevice, SmallBudgetsFallBackToTheHost) {
  const int64_t K = 256, N = 300;
  const std::vector<double> gram = make_gram(K, 2 * K, 17, -1);
  const Weight w(DType::kFloat32, K, N, 0, 8);
  const QuantSpec spec{4, 64, true};
  auto cpu = make_cpu_backend();
  const GptqFactor fc = cpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  QuantResult want;
  cpu->gptq_quantize(w.m, spec, fc, options(128), want);

  auto small = emulated(900 << 10);  // below H (K² · 8 bytes) and a staging panel
  const GptqFactor fs = small->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  EXPECT_TRUE(op(*small, "gptq_factor").host_fallback);
  EXPECT_EQ(small->download(fs.upper), cpu->download(fc.upper));
  QuantResult got;
  small->gptq_quantize(w.m, spec, fs, options(128), got);
  expect_same(want, got);
  const OpTransfers q = op(*small, "gptq_quantize");
  EXPECT_FALSE(q.host_fallback);
  EXPECT_EQ(q.h2d_bytes, w.bytes() + uint64_t(K * K) * 4 + uint64_t(K) * (8 + 8 + 4 + 1 + 4) + 5 * 4);
  EXPECT_LE(small->device_memory().peak, small->device_memory().budget);

  // Room for H and a staging panel, not for U beside H: the factor is made on the device all the same (U
  // is narrowed to float32 in H's own memory), and sweeps there.
  auto snug = emulated(1200 << 10);
  const GptqFactor fn = snug->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  EXPECT_FALSE(op(*snug, "gptq_factor").host_fallback);
  ASSERT_TRUE(fn.upper.buffer);
  QuantResult on_device;
  snug->gptq_quantize(w.m, spec, fn, options(128), on_device);
  EXPECT_FALSE(op(*snug, "gptq_quantize").host_fallback);
  expect_same(want, on_device);
  EXPECT_LE(snug->device_memory().peak, snug->device_memory().budget);

  auto tiny = emulated(200 << 10);  // not even U fits
  QuantResult host;
  tiny->gptq_quantize(w.m, spec, fc, options(128), host);
  EXPECT_TRUE(op(*tiny, "gptq_quantize").host_fallback);
  expect_same(want, host);

  // A device factor, then too little left beside it for one chunk of the sweep (two Cholesky factors
  // kept on the device hold the rest; lazy batches of K make each column's batch buffers larger): the
  // host sweeps, with U brought back from the device.
  auto held = emulated(1920 << 10);
  const GptqFactor fd = held->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  ASSERT_TRUE(fd.upper.buffer);
  std::vector<GramFactor> holds;
  for (int64_t k : {300, 260}) {
    std::vector<double> eye(size_t(k * k), 0.0);
    for (int64_t i = 0; i < k; ++i) eye[size_t(i * k + i)] = 1.0;
    holds.push_back(held->gram_cholesky_upper(g64(eye, k)));
    ASSERT_TRUE(holds.back().upper.buffer);
  }
  QuantResult want_k, back;
  cpu->gptq_quantize(w.m, spec, fc, options(K), want_k);
  held->gptq_quantize(w.m, spec, fd, options(K), back);
  EXPECT_TRUE(op(*held, "gptq_quantize").host_fallback);
  EXPECT_EQ(op(*held, "gptq_quantize").d2h_bytes, uint64_t(K * K) * 4);
  expect_same(want_k, back);
}

// MatMulNBits (QuantResult::keep): the sweep leaves the codes, scales and zero points on the device and
// the packings read them there, giving the CPU's bytes: only the error sum comes back from the sweep, and
// nothing goes up for the packings. Both layouts, with and without zero points, in 128-column panels. A
// device whose memory is mostly held (two kept Cholesky factors) has no room for the result beside the
// sweep: it comes back as ever, the same bytes.
TEST(GptqDevice, KeptResultIsPackedAsTheCpu) {
  const int64_t K = 192, N = 300, B = 64;
  const std::vector<double> gram = make_gram(K, 2 * K, 21, -1);
  auto cpu = make_cpu_backend();
  const GptqFactor fc = cpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
  for (const int k_axis : {0, 1})
    for (const bool zp : {false, true})
      for (const bool held : {false, true}) {
        SCOPED_TRACE("k_axis " + std::to_string(k_axis) + (zp ? " zp" : " sym") + (held ? " held" : ""));
        const Weight w(DType::kFloat16, K, N, k_axis, 11);
        QuantSpec spec{4, B, zp};
        const uint64_t budget = held ? uint64_t(1536) << 10 : uint64_t(64) << 20;
        auto gpu = emulated(budget);
        const GptqFactor fg = gpu->gptq_factor(g64(gram, K), nullptr, 0.01, true);
        ASSERT_TRUE(fg.upper.buffer);
        std::vector<GramFactor> holds;
        for (int64_t k : held ? std::vector<int64_t>{300, 260} : std::vector<int64_t>{}) {
          std::vector<double> eye(size_t(k * k), 0.0);
          for (int64_t i = 0; i < k; ++i) eye[size_t(i * k + i)] = 1.0;
          holds.push_back(gpu->gram_cholesky_upper(g64(eye, k)));
          ASSERT_TRUE(holds.back().upper.buffer);
        }
        QuantResult want, got;
        got.keep = true;
        cpu->gptq_quantize(w.m, spec, fc, options(128), want);
        gpu->gptq_quantize(w.m, spec, fg, options(128), got);
        EXPECT_EQ(0, std::memcmp(&want.sq_error, &got.sq_error, 8));
        EXPECT_EQ(want.groups, got.groups);
        EXPECT_EQ(gpu->pack_matmulnbits_weight(w.m, spec, got, B), cpu->pack_matmulnbits_weight(w.m, spec, want, B));
        EXPECT_EQ(gpu->matmulnbits_scales(w.m, got), cpu->matmulnbits_scales(w.m, want));
        if (zp) {
          EXPECT_EQ(gpu->pack_matmulnbits_zero_points(w.m, spec, got), cpu->pack_matmulnbits_zero_points(w.m, spec, want));
        }
        const OpTransfers q = op(*gpu, "gptq_quantize");
        EXPECT_FALSE(q.host_fallback);
        EXPECT_LE(gpu->device_memory().peak, budget);
        if (held) {
          EXPECT_TRUE(got.kept.empty());
          expect_same(want, got);
          continue;
        }
        ASSERT_TRUE(got.kept.buffer);
        EXPECT_TRUE(got.codes.empty() && got.packed.empty() && got.scales.empty() && got.zero_points.empty());
        EXPECT_EQ(q.d2h_bytes, 8u);  // the error sum alone
        for (const char* o : {"pack_matmulnbits_weight", "matmulnbits_scales", "pack_matmulnbits_zero_points"})
          EXPECT_EQ(op(*gpu, o).h2d_bytes, 0u) << o;
        EXPECT_EQ(op(*gpu, "pack_matmulnbits_weight").d2h_bytes, uint64_t(K * N) / 2);
      }
}

// The layer engine's statistics (calib/engine_statistics.h over Backend::accumulate_statistics): their values
// against the definition, their independence of the thread count, the hand-off to the search through
// Calibration, and on the emulated device the CPU's bits, left on the device where the search reads them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "calib/engine_statistics.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/parallel.h"

namespace nibble {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <class T>
std::vector<T> values(kernels::Backend& b, const kernels::Tensor& t) {
  const std::vector<uint8_t> raw = b.download(t);
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

// Whole and block-diagonal statistics of two batch runs (the second longer than one product), every 7th row
// not counted.
struct Measured {
  MeasuredActivation whole, blocks;
};
Measured measure(kernels::Backend& b, const std::vector<float>& x, int64_t rows, int64_t K,
                 const std::vector<int64_t>& counted) {
  ActivationAccumulator whole(b, K, 0), blocks(b, K, 16);
  for (ActivationAccumulator* acc : {&whole, &blocks}) {
    acc->add_rows(x.data(), 400, counted.data());
    acc->add_rows(x.data() + 400 * K, rows - 400, counted.data() + 400);
  }
  return {whole.finish(), blocks.finish()};
}

TEST(EngineStatistics, GramAndAbsSumsFollowTheirDefinitionOverCountedRows) {
  const int64_t K = 37, rows = 2500;  // more rows than one product takes
  const auto x = random_floats(size_t(rows * K), 9);
  std::vector<int64_t> counted(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) counted[size_t(r)] = (r % 7) != 3;
  auto cpu = kernels::make_cpu_backend();
  Measured got = measure(*cpu, x, rows, K, counted);
  MeasuredActivation& m = got.whole;
  const MeasuredActivation& b = got.blocks;
  EXPECT_TRUE(m.packed);  // the upper triangle only, until the search reads it
  EXPECT_EQ(m.gram.elements(), K * (K + 1) / 2);
  EXPECT_FALSE(b.packed);
  unpack_gram(m);
  EXPECT_FALSE(m.packed);
  ASSERT_EQ(m.gram.shape, (std::vector<int64_t>{K, K}));
  const double* g = m.gram.f64();  // the CPU's statistics are host memory
  const double* gb = b.gram.f64();
  int64_t n = 0;
  for (int64_t c : counted) n += c;
  EXPECT_EQ(m.rows, n);
  EXPECT_EQ(b.rows, n);
  for (int64_t i = 0; i < K; ++i) {
    double s = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      if (counted[size_t(r)]) s += std::fabs(x[size_t(r * K + i)]);
    EXPECT_NEAR(m.sum_abs[size_t(i)], s, 1e-9 * s);
    for (int64_t j = 0; j < K; ++j) {
      double want = 0.0, mag = 0.0;
      for (int64_t r = 0; r < rows; ++r)
        if (counted[size_t(r)]) {
          want += double(x[size_t(r * K + i)]) * x[size_t(r * K + j)];
          mag += std::fabs(double(x[size_t(r * K + i)]) * x[size_t(r * K + j)]);
        }
      EXPECT_NEAR(g[i * K + j], want, 1e-6 * mag) << i << "," << j;  // float32 products, float64 sums
      if (i / 16 == j / 16) {  // the diagonal blocks hold the same sums
        EXPECT_EQ(gb[(i / 16) * 256 + (i % 16) * 16 + j % 16], g[i * K + j]) << i << "," << j;
      }
    }
  }
}

TEST(EngineStatistics, GramPanelsFollowTheDefinitionAtAnyThreadCount) {
  const int64_t K = 300, rows = 700;  // three column panels (128, 128, 44)
  const auto x = random_floats(size_t(rows * K), 11);
  auto cpu = kernels::make_cpu_backend();
  std::vector<double> got[2], sums[2];
  for (int t : {1, 3}) {
    kernels::set_num_threads(t);
    ActivationAccumulator acc(*cpu, K, 0);
    acc.add_rows(x.data(), rows, nullptr);
    MeasuredActivation m = acc.finish();
    unpack_gram(m);
    got[t == 3] = values<double>(*cpu, m.gram);
    sums[t == 3] = m.sum_abs;
  }
  kernels::set_num_threads(0);
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(sums[0], sums[1]);
  for (int64_t i = 0; i < K; i += 7)
    for (int64_t j = 0; j < K; ++j) {
      double g = 0.0, mag = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        g += double(x[size_t(r * K + i)]) * x[size_t(r * K + j)];
        mag += std::fabs(double(x[size_t(r * K + i)]) * x[size_t(r * K + j)]);
      }
      EXPECT_NEAR(got[0][size_t(i * K + j)], g, double(rows) * 6e-8 * mag) << i << "," << j;
    }
}

// The search reads a packed XᵀX through Calibration as the whole matrix, whichever accessor it uses.
TEST(EngineStatistics, CalibrationServesAPackedGramWhole) {
  const int64_t K = 150, rows = 90;
  const auto x = random_floats(size_t(rows * K), 12);
  auto cpu = kernels::make_cpu_backend();
  std::map<std::string, MeasuredActivation> measured;
  for (const char* name : {"a", "b"}) {
    ActivationAccumulator acc(*cpu, K, 0);
    acc.add_rows(x.data(), rows, nullptr);
    measured[name] = acc.finish();
  }
  ActivationAccumulator acc(*cpu, K, 0);
  acc.add_rows(x.data(), rows, nullptr);
  MeasuredActivation whole = acc.finish();
  const std::vector<double> want = values<double>(*cpu, cpu->unpack_gram(whole.gram, K));
  auto calib = Calibration::from_measured(std::move(measured), rows);
  const ActivationStats st = calib->stats("a", false);
  EXPECT_EQ(st.rows, rows);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), st.gram));
  int64_t block = -1;
  const double* g = calib->gram_stored("b", K, &block);
  EXPECT_EQ(block, 0);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), g));
  for (int64_t i = 0; i < K; ++i) EXPECT_EQ(g[i * K + (K - 1 - i)], g[(K - 1 - i) * K + i]);  // both triangles
  EXPECT_EQ(calib->gram_tensor("a", K).f64(), st.gram);  // the tensor the search takes: the same memory
}

const kernels::OpTransfers& op_of(const kernels::Backend& b, const std::string& name) {
  static const kernels::OpTransfers none{};
  const auto it = b.transfer_ledger()->ops.find(name);
  return it == b.transfer_ledger()->ops.end() ? none : it->second;
}

// On the emulated device the statistics are the CPU's bit for bit and stay on the device: the counted rows
// go up once, Σ|x| (K values) comes back, XᵀX never crosses the bus; the search's tensors (the whole Gram,
// its factor, the float32 G, the channel energies) are made there, and are the CPU's.
TEST(EngineStatistics, EmulatedDeviceKeepsTheCpuStatisticsWhereTheSearchReadsThem) {
  if (!kernels::cuda_emulated_compiled()) GTEST_SKIP() << "no emulated device in this build";
  const int64_t K = 300, rows = 2500;  // three column panels; more rows than one product
  const auto x = random_floats(size_t(rows * K), 13);
  std::vector<int64_t> counted(static_cast<size_t>(rows));
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) n += counted[size_t(r)] = (r % 5) != 1;
  auto cpu = kernels::make_cpu_backend();
  auto emu = kernels::make_backend({kernels::Device::kCudaEmulated, uint64_t(256) << 20}, nullptr);
  Measured want = measure(*cpu, x, rows, K, counted), got = measure(*emu, x, rows, K, counted);
  EXPECT_EQ(got.whole.rows, n);
  EXPECT_EQ(got.whole.sum_abs, want.whole.sum_abs);
  EXPECT_EQ(got.blocks.sum_abs, want.blocks.sum_abs);
  EXPECT_EQ(got.whole.gram.data, nullptr);  // on the device
  const kernels::OpTransfers up = op_of(*emu, "upload"), acc = op_of(*emu, "accumulate_statistics");
  EXPECT_EQ(up.h2d_bytes, uint64_t(2 * n * K * 4));  // each batch's counted rows once, for both accumulators
  EXPECT_EQ(acc.h2d_bytes, 0u);                      // read where upload put them
  EXPECT_EQ(acc.d2h_bytes, 0u);
  EXPECT_EQ(acc.calls, 4u);
  EXPECT_FALSE(acc.host_fallback);
  EXPECT_EQ(op_of(*emu, "download").d2h_bytes, uint64_t(2 * K * 8));  // Σ|x| of each
  EXPECT_EQ(values<double>(*emu, got.whole.gram), values<double>(*cpu, want.whole.gram));
  EXPECT_EQ(values<double>(*emu, got.blocks.gram), values<double>(*cpu, want.blocks.gram));

  std::map<std::string, MeasuredActivation> on_cpu, on_emu;
  on_cpu["a"] = std::move(want.whole);
  on_emu["a"] = std::move(got.whole);
  auto cc = Calibration::from_measured(std::move(on_cpu), n), ce = Calibration::from_measured(std::move(on_emu), n);
  const kernels::Tensor gc = cc->gram_tensor("a", K), ge = ce->gram_tensor("a", K);
  EXPECT_EQ(ge.data, nullptr);  // unpacked on the device
  EXPECT_EQ(ce->stats("a", false).gram, nullptr);
  EXPECT_EQ(values<double>(*emu, ge), values<double>(*cpu, gc));
  const uint64_t up_before = emu->transfer_ledger()->total.h2d_bytes;
  const kernels::GramFactor fc = cpu->gram_cholesky_upper(gc), fe = emu->gram_cholesky_upper(ge);
  ASSERT_TRUE(fe.ok());
  EXPECT_EQ(values<float>(*emu, fe.upper), values<float>(*cpu, fc.upper));
  EXPECT_EQ(values<float>(*emu, emu->gram_to_f32(ge)), values<float>(*cpu, cpu->gram_to_f32(gc)));
  const auto s = random_floats(size_t(K), 14);
  EXPECT_EQ(emu->channel_energy(ge, s.data()), cpu->channel_energy(gc, s.data()));
  EXPECT_EQ(emu->transfer_ledger()->total.h2d_bytes - up_before, uint64_t(K) * 4);  // s alone went up
  EXPECT_TRUE(emu->all_finite(ge));
}

}  // namespace
}  // namespace nibble

// The cooperative kernels as the emulated device runs them (kernels/cuda/launch_blocks.h: phases by
// loop fission, shared memory a per-block local): the launcher's contract, the fixed reduction tree,
// the AWQ loss's column sums and RTN on [N, K] weights against their plain references, bit for bit.
// Compiled like the emulated backend (Thrust's host system, -ffp-contract=off).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/backend.h"
#include "kernels/backend_check_data.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/cuda/column_dot_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch_blocks.h"
#include "kernels/cuda/rtn_blocks.h"
#include "kernels/tree_reduce.h"

using namespace nibble;
using namespace nibble::kernels;
using namespace nibble::kernels::gpu;

namespace {

// Three phases, each reading what other lanes wrote in the phase before.
struct ShiftBody {
  static constexpr int kLanes = 64, kPhases = 3;
  struct Shared {
    int64_t a[kLanes], b[kLanes];
  };
  int64_t* out;
  template <int P>
  NIBBLE_HD void phase(int64_t block, int lane, Shared& sh) const {
    if constexpr (P == 0) sh.a[lane] = block * 1000 + lane;
    if constexpr (P == 1) sh.b[lane] = sh.a[(lane + 1) % kLanes] * 2;
    if constexpr (P == 2) out[block * kLanes + lane] = sh.b[kLanes - 1 - lane] + sh.a[lane];
  }
};

int64_t shift_want(int64_t block, int lane) { return (block * 1000 + (64 - lane) % 64) * 2 + block * 1000 + lane; }

// Phase 0 writes each lane's value, phase 1 reduces each warp's 32 values to its lane 0.
template <class T, class Op>
struct WarpSumBody {
  static constexpr int kLanes = 128, kPhases = 2;
  struct Shared {
    T v[kLanes];
  };
  const T* in;
  T* out;  // one per warp
  Op op;
  template <int P>
  NIBBLE_HD void phase(int64_t block, int lane, Shared& sh) const {
    if constexpr (P == 0) {
      sh.v[lane] = in[block * kLanes + lane];
    } else {
      const T r = warp_tree_reduce(sh.v, lane, op);
      if (lane % kWarp == 0) out[block * (kLanes / kWarp) + lane / kWarp] = r;
    }
  }
};

// Sets the emulated device's host threads (Thrust's OpenMP system); returns the previous count.
int set_emulated_threads(int n) {
#ifdef _OPENMP
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  return before;
#else
  (void)n;
  return 1;
#endif
}

}  // namespace

TEST(LaunchBlocks, PhasesSeeTheSharedWritesOfEarlierPhases) {
  auto dev = make_emulated_device(1 << 20);
  const int64_t blocks = 37;
  std::vector<int64_t> out(size_t(blocks * 64), -1);
  launch_blocks(*dev, blocks, ShiftBody{out.data()});
  for (int64_t b = 0; b < blocks; ++b)
    for (int l = 0; l < 64; ++l) ASSERT_EQ(out[size_t(b * 64 + l)], shift_want(b, l)) << b << "," << l;
  EXPECT_EQ(dev->ledger().total.launches, 1u);
  launch_blocks(*dev, 0, ShiftBody{out.data()});  // nothing to run: no launch
  EXPECT_EQ(dev->ledger().total.launches, 1u);
}

TEST(LaunchBlocks, ResultsDoNotDependOnTheEmulatedThreadCount) {
  auto dev = make_emulated_device(1 << 20);
  const int64_t blocks = 301;
  std::mt19937 rng(7);
  std::normal_distribution<double> nd;
  std::vector<double> in(size_t(blocks * 128));
  for (double& v : in) v = nd(rng) * std::exp(3 * nd(rng));  // wide magnitudes: the order shows in the bits
  std::vector<std::vector<double>> results;
  const int before = set_emulated_threads(1);
  for (int threads : {1, 2, 5}) {
    set_emulated_threads(threads);
    std::vector<double> out(size_t(blocks * 4));
    launch_blocks(*dev, blocks, WarpSumBody<double, PlusOp>{in.data(), out.data(), PlusOp{}});
    std::vector<int64_t> shifted(size_t(blocks * 64));
    launch_blocks(*dev, blocks, ShiftBody{shifted.data()});
    for (int64_t b = 0; b < blocks; ++b) ASSERT_EQ(shifted[size_t(b * 64 + 9)], shift_want(b, 9));
    results.push_back(out);
  }
  set_emulated_threads(before);
  for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * 8), 0);
}

TEST(TreeReduce, IsThePairwiseTreeNotTheSerialSum) {
  // v[0] and v[16] cancel at the tree's first level, so all fifteen pairs of ones survive: 30. In
  // order, each one is lost beside 1e16 (half an ulp) until -1e16 comes: 15.
  double v[32];
  for (double& x : v) x = 1.0;
  v[0] = 1e16, v[16] = -1e16;
  double serial = 0;
  for (double x : v) serial += x;
  EXPECT_EQ(serial, 15.0);
  EXPECT_EQ(tree_reduce<32>(v, PlusOp{}), 30.0);
  // The levels spelled out for 8 values: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
  const double w[8] = {1e-3, 7.0, 1e9, -3.5, 2e-7, 1e12, -1e9, 0.25};
  double t[8];
  std::memcpy(t, w, sizeof t);
  const double want = ((w[0] + w[4]) + (w[2] + w[6])) + ((w[1] + w[5]) + (w[3] + w[7]));
  EXPECT_EQ(tree_reduce<8>(t, PlusOp{}), want);
}

TEST(TreeReduce, WarpReductionInALaunchEqualsThePlainTree) {
  auto dev = make_emulated_device(1 << 20);
  const int64_t blocks = 9;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<double> in(size_t(blocks * 128));
  std::vector<float> inf(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = double(nd(rng)) * std::exp(4.0 * double(nd(rng)));
    inf[i] = std::fabs(nd(rng));
  }
  inf[40] = NAN;  // the serial amax's rule: a NaN wins
  std::vector<double> out(size_t(blocks * 4));
  std::vector<float> outf(out.size());
  launch_blocks(*dev, blocks, WarpSumBody<double, PlusOp>{in.data(), out.data(), PlusOp{}});
  launch_blocks(*dev, blocks, WarpSumBody<float, AmaxOp>{inf.data(), outf.data(), AmaxOp{}});
  for (int64_t w = 0; w < blocks * 4; ++w) {
    double v[32];
    float a[32], serial = 0.0f;
    for (int i = 0; i < 32; ++i) {
      v[i] = in[size_t(w * 32 + i)], a[i] = inf[size_t(w * 32 + i)];
      serial = AmaxOp{}(serial, a[i]);
    }
    const double want = tree_reduce<32>(v, PlusOp{});
    EXPECT_EQ(std::memcmp(&out[size_t(w)], &want, 8), 0) << w;
    const float amax = tree_reduce<32>(a, AmaxOp{});
    if (w == 1) {
      EXPECT_TRUE(std::isnan(outf[size_t(w)]));
    } else {
      EXPECT_EQ(outf[size_t(w)], amax) << w;
      EXPECT_EQ(outf[size_t(w)], serial) << w;  // max is exact: any order gives the serial value
    }
  }
}

namespace {

// Two row-major [K, width] arrays of products with wide magnitudes (the order shows in the bits).
struct Columns {
  std::vector<float> a, b;
};
Columns columns(int64_t K, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Columns c{std::vector<float>(size_t(K * width)), std::vector<float>(size_t(K * width))};
  for (size_t i = 0; i < c.a.size(); ++i) {
    c.a[i] = nd(rng) * std::exp(2.0f * nd(rng));
    c.b[i] = nd(rng);
  }
  return c;
}

}  // namespace

TEST(ColumnDot, BlocksEqualColumnDotRefBitForBit) {
  auto dev = make_emulated_device(1 << 20);
  for (int64_t K : {1, 15, 16, 203, 576}) {
    for (int64_t width : {1, 31, 70}) {  // partial warps of columns
      const Columns c = columns(K, width, uint32_t(K * 100 + width));
      std::vector<double> got(size_t(width), -1.0), partial(size_t(kColumnSlices * width));
      launch_blocks(*dev, column_dot_blocks(width),
                    ColumnDotBlocks{c.a.data(), c.b.data(), K, width, 0, nullptr, true, true, got.data()});
      // The same column sums in row panels of 37 rows (a Gram matrix streamed within a budget).
      std::vector<double> panels(size_t(width), -1.0);
      for (int64_t r0 = 0; r0 < K; r0 += 37) {
        const int64_t nr = std::min<int64_t>(37, K - r0);
        launch_blocks(*dev, column_dot_blocks(width),
                      ColumnDotBlocks{c.a.data() + r0 * width, c.b.data() + r0 * width, nr, width, r0,
                                      partial.data(), r0 == 0, r0 + nr == K, panels.data()});
      }
      for (int64_t n = 0; n < width; ++n) {
        const double want = column_dot_ref(c.a.data() + n, c.b.data() + n, K, width);
        ASSERT_EQ(std::memcmp(&got[size_t(n)], &want, 8), 0) << "K " << K << " width " << width << " column " << n;
        ASSERT_EQ(std::memcmp(&panels[size_t(n)], &want, 8), 0) << "K " << K << " width " << width << " column " << n;
      }
    }
  }
  // The order is not the serial one: for some column of a long K the bits differ.
  const Columns c = columns(576, 64, 5);
  int differ = 0;
  for (int64_t n = 0; n < 64; ++n) {
    double serial = 0;
    for (int64_t k = 0; k < 576; ++k) serial += double(c.a[size_t(k * 64 + n)]) * double(c.b[size_t(k * 64 + n)]);
    differ += serial != column_dot_ref(c.a.data() + n, c.b.data() + n, 576, 64);
  }
  EXPECT_GT(differ, 0);
}

// The CPU backend and the emulated device run the AWQ loss's products in the same column tiles
// (triangular_loss_chunk(N) for ‖U D‖², kGramLossColumns for the Gram form; kernels/backend.h), so their
// losses are the same bits whatever BLAS kernel set runs: OpenBLAS's Haswell set rounds a product
// differently with the call's width, and before the tiles were shared these agreed only to the float32
// products' precision beyond 256 columns. N = 2500 is four triangular tiles (640 wide); the 16 MiB device
// splits it into panels of two tiles.
TEST(ColumnDot, CpuAndEmulatedDeviceAwqLossesAreTheSameBits) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto cpu = make_backend({Device::kCpu, 0}, nullptr);
  const int64_t K = 600, T = 1200;
  const auto gram = check::gram(T, K, 4);
  const std::vector<float> g32(gram.begin(), gram.end());
  const GramFactor upper = cpu->gram_cholesky_upper(kernels::host_view(DType::kFloat64, {K, K}, gram.data()));
  ASSERT_EQ(upper.upper.elements(), K * K);
  const auto s1 = check::positive(K, 0.5f, 2.0f, 1), s2 = check::positive(K, 0.25f, 4.0f, 2);
  const std::vector<float> ratios{1.0f, 0.9f, 0.8f};
  for (uint64_t budget : {uint64_t(0), uint64_t(16) << 20}) {
    auto emu = make_backend({Device::kCudaEmulated, budget}, nullptr);
    for (const check::Case c : {check::Case{DType::kFloat32, 0, K, 96, 64, 4, false},
                                check::Case{DType::kFloat16, 1, K, 256, 32, 4, true},
                                check::Case{DType::kFloat32, 0, K, 300, 64, 4, false},
                                check::Case{DType::kFloat16, 1, K, 520, 32, 4, true},
                                check::Case{DType::kFloat32, 0, K, 2500, 64, 4, false}}) {
      const check::Weight w = check::make_weight(c, 11);
      for (bool factor : {false, true})
        for (bool clip : {false, true}) {
          const GramForm form{K, T, host_view(DType::kFloat32, {K, K}, g32.data()), factor ? upper.upper : Tensor{}};
          const auto want = cpu->awq_losses(w.m, {s1.data(), s2.data()}, c.spec(), form, clip ? &ratios : nullptr);
          const auto got = emu->awq_losses(w.m, {s1.data(), s2.data()}, c.spec(), form, clip ? &ratios : nullptr);
          const std::string at = c.label() + (factor ? " factor" : " gram") + (clip ? " clip" : "") + " budget " +
                                 std::to_string(budget >> 20) + " MiB";
          EXPECT_EQ(check::same(want, got, "losses"), "") << at;
        }
    }
  }
}

namespace {

// A [N, K] weight (k_axis 1) of normal values with ties, zeros, a -0 and an all-zero block.
check::Weight nk_weight(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  check::Weight w;
  w.bytes.resize(size_t(N * K) * dtype_size(t));
  for (int64_t i = 0; i < N * K; ++i) {
    float v = nd(rng);
    if (i % 7 == 3) v = 0.5f;
    if (i % 11 == 5) v = -0.0f;
    if (i < K / 2) v = 0.0f;  // the first row's first blocks: zero
    hd::store(int(t), w.bytes.data(), i, v);
  }
  w.m = WeightMatrix{t, w.bytes.data(), N, K, 1};
  return w;
}

}  // namespace

TEST(RtnWarpBlocks, EqualsTheReferenceBitForBitOnNKWeights) {
  auto dev = make_emulated_device(1 << 20);
  for (DType t : {DType::kFloat32, DType::kFloat16})
    for (int64_t block : {16, 32, 48, 128})  // part of a warp, a warp, one and a half, four per lane
      for (bool zp : {false, true}) {
        const int64_t N = 13, K = 200, G = num_blocks(K, block);  // K not a multiple of the block
        const check::Weight w = nk_weight(t, N, K, uint32_t(block) + (zp ? 1000 : 0));
        const QuantSpec spec{4, block, zp};
        QuantResult want;
        rtn_quantize_ref(w.m, spec, want);
        std::vector<uint8_t> codes(size_t(N * K)), zps(size_t(G * N));
        std::vector<float> scales(size_t(G * N));
        std::vector<double> err(size_t(G * N));
        const WeightView v{w.m.data, int(t), N, K, 1};
        launch_rtn(*dev, v, BlockShape{4, block, zp, int(t)},
                   QuantOut{codes.data(), scales.data(), zp ? zps.data() : nullptr, err.data()});
        const std::string at = std::string(dtype_name(t)) + " block " + std::to_string(block) + (zp ? " zp" : "");
        EXPECT_EQ(check::same(want.codes, codes, "codes"), "") << at;
        EXPECT_EQ(check::same(want.scales, scales, "scales"), "") << at;
        if (zp) {
          EXPECT_EQ(check::same(want.zero_points, zps, "zero points"), "") << at;
        }
        // Each block's error: its lanes' sums (lane j: k0 + j, k0 + j + 32, ...; in float for fp16 weights)
        // added in double by the tree.
        for (int64_t n = 0; n < N; ++n)
          for (int64_t g = 0; g < G; ++g) {
            float lane16[32] = {};
            double lane[32] = {};
            const int64_t k0 = g * block, k1 = std::min(K, k0 + block);
            const hd::Params p{want.scales[size_t(n * G + g)], zp ? want.zero_points[size_t(n * G + g)] : uint8_t(0)};
            for (int64_t k = k0; k < k1; ++k) {
              const float x = hd::load(int(t), w.m.data, n * K + k);
              const float dq = hd::round_to(int(t), hd::dequantize(want.codes[size_t(n * K + k)], p, zp));
              lane16[(k - k0) % 32] += (x - dq) * (x - dq);
              lane[(k - k0) % 32] += (double(x) - double(dq)) * (double(x) - double(dq));
            }
            if (t == DType::kFloat16)
              for (int j = 0; j < 32; ++j) lane[j] = double(lane16[j]);
            const double e = tree_reduce<32>(lane, PlusOp{});
            ASSERT_EQ(std::memcmp(&err[size_t(g * N + n)], &e, 8), 0) << at << " block " << g << " column " << n;
          }
      }
}

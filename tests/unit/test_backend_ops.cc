// Every backend operation on every backend this build has (cpu, cuda_emulated, and cuda when a
// device exists) against the reference kernels, as ggml's test-backend-ops does; then what only the
// CUDA backend has: its device layer (budgeted allocator, BLAS), its shared scalar arithmetic and
// its streaming in panels within a device-memory budget.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "kernels/backend.h"
#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/hd_float.h"
#include "kernels/cuda/linalg.h"
#include "half_ref.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

// The backend of that name, or null where this build or machine has none (why: the reason).
std::unique_ptr<Backend> backend_named(const std::string& name, std::string& why) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda_emulated") {
    if (cuda_emulated_compiled()) return make_backend({Device::kCudaEmulated, 0}, nullptr);
    why = "no CCCL headers at configure time";
    return nullptr;
  }
  if (!cuda_compiled()) {
    why = "no CUDA backend in this build";
    return nullptr;
  }
  try {
    return make_backend({Device::kCuda, 0}, nullptr);
  } catch (const std::runtime_error& e) {
    // no device here: the GPU-only adapters are checked by `nibble selftest --device cuda` on one
    why = e.what();
    return nullptr;
  }
}

std::unique_ptr<Backend> emulated(uint64_t budget) { return make_backend({Device::kCudaEmulated, budget}, nullptr); }

}  // namespace

// One test per backend, so that the sanitizer pass's shards (one per core) take them apart: together they
// were half of one shard's time.
class EveryOperation : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryOperation, MatchesTheReference) {
  std::string why;
  const std::unique_ptr<Backend> b = backend_named(GetParam(), why);
  if (!b) GTEST_SKIP() << GetParam() << ": " << why;
  EXPECT_EQ(b->name(), GetParam());
  std::set<std::string> seen;
  for (const OpCheck& c : check_backend_ops(*b)) {
    EXPECT_TRUE(c.passed()) << c.op << ": " << c.error;
    EXPECT_GT(c.cases, 0) << c.op;
    seen.insert(c.op);
  }
  EXPECT_EQ(seen, std::set<std::string>(backend_op_names().begin(), backend_op_names().end()));
}

INSTANTIATE_TEST_SUITE_P(OnEachBackend, EveryOperation, ::testing::Values("cpu", "cuda_emulated", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(BackendOps, CasesCoverDtypesLayoutsBitsZeroPointAndPartialBlocks) {
  std::set<std::string> seen;
  bool partial = false, whole = false;
  for (const auto& c : check::cases()) {
    seen.insert(dtype_name(c.dtype) + std::to_string(c.k_axis) + std::to_string(c.bits) + std::to_string(c.zero_point));
    partial |= c.K % c.block != 0;
    whole |= c.K == c.block;
  }
  EXPECT_EQ(seen.size(), 3u * 2u * 2u * 2u);
  EXPECT_TRUE(partial);
  EXPECT_TRUE(whole);
}

TEST(CudaEmulated, ChosenOnlyWhenAskedWithItsBudget) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  std::string why;
  auto b = make_backend({Device::kCudaEmulated, 64u << 20}, &why);
  EXPECT_EQ(b->name(), "cuda_emulated");
  EXPECT_NE(why.find("64 MiB"), std::string::npos) << why;
  EXPECT_EQ(b->device_memory().budget, 64u << 20);
  EXPECT_EQ(make_backend({Device::kCudaEmulated, 0}, nullptr)->device_memory().budget, uint64_t(1) << 30);
  auto a = make_backend({Device::kAuto, 0}, &why);
  EXPECT_NE(a->name(), "cuda_emulated");
}

TEST(CudaEmulated, AllocatorEnforcesTheBudgetAndRecordsThePeak) {
  auto dev = gpu::make_emulated_device(1u << 20);
  {
    gpu::DeviceBuffer<uint8_t> a(*dev, 300000), b(*dev, 500000);
    EXPECT_EQ(dev->in_use(), gpu::DeviceLayer::counted(300000) + gpu::DeviceLayer::counted(500000));
    try {
      gpu::DeviceBuffer<uint8_t> c(*dev, 400000);
      FAIL() << "an allocation over the budget succeeded";
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("budget of 1 MiB"), std::string::npos) << m;
      EXPECT_NE(m.find("--device_memory"), std::string::npos) << m;
    }
  }
  // Released blocks stay in the pool: still held (a caching allocator's memory is the device's), not live.
  EXPECT_EQ(dev->in_use_live(), 0u);
  EXPECT_EQ(dev->in_use(), gpu::DeviceLayer::counted(300000) + gpu::DeviceLayer::counted(500000));
  EXPECT_EQ(dev->peak(), gpu::DeviceLayer::counted(300000) + gpu::DeviceLayer::counted(500000));
  const uint64_t peak = dev->peak();
  EXPECT_EQ(peak, 300032u + 500224u);  // each rounded up to 256 bytes
  {
    gpu::DeviceBuffer<uint8_t> again(*dev, 300000);  // served by the pool: nothing more held
    EXPECT_EQ(dev->in_use(), peak);
    EXPECT_EQ(dev->peak(), peak);
  }
  // A request that does not fit beside the pool empties it first instead of failing.
  gpu::DeviceBuffer<uint8_t> big(*dev, 900000);
  EXPECT_EQ(dev->in_use(), gpu::DeviceLayer::counted(900000));
  EXPECT_EQ(dev->peak(), gpu::DeviceLayer::counted(900000));
}

// The kernels' element access by type number (hd_float.h) against the plain reference conversions:
// every half and bf16 read, and a sample of float bit patterns rounded and written.
TEST(CudaEmulated, ScalarArithmeticMatchesReference) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = uint16_t(h);
    const float a = hd::load(hd::kF16, &v, 0), b = test::half_to_float_ref(v);
    ASSERT_EQ(0, std::memcmp(&a, &b, 4)) << h;
    const float c = hd::load(hd::kBF16, &v, 0), d = test::bf16_to_float_ref(v);
    ASSERT_EQ(0, std::memcmp(&c, &d, 4)) << h;
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    uint16_t h16 = 0, b16 = 0;
    hd::store(hd::kF16, &h16, 0, f);
    hd::store(hd::kBF16, &b16, 0, f);
    ASSERT_EQ(h16, test::float_to_half_ref(f)) << bits;
    ASSERT_EQ(b16, test::float_to_bf16_ref(f)) << bits;
    const float r = hd::round_to(hd::kF16, f), want = test::half_to_float_ref(test::float_to_half_ref(f));
    ASSERT_EQ(0, std::memcmp(&r, &want, 4)) << bits;
  }
}

// OpenBLAS behind the LinAlg interface, column-major as cuBLAS: each call against a plain loop.
TEST(CudaEmulated, LinAlgIsColumnMajorBlas) {
  auto la = gpu::make_blas_linalg();
  const int m = 5, n = 4, k = 3;
  std::vector<float> A(m * k), B(k * n), C(m * n, 1.0f);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(i % 7) - 3.0f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(i % 5) * 0.5f;
  la->sgemm(gpu::Op::kN, gpu::Op::kN, m, n, k, 2.0f, A.data(), m, B.data(), k, 1.0f, C.data(), m);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float want = 1.0f;
      for (int p = 0; p < k; ++p) want += 2.0f * A[p * m + i] * B[j * k + p];
      EXPECT_FLOAT_EQ(C[j * m + i], want) << i << "," << j;
    }
  // Strided batch: matrix i of A, B and C at i·stride; each equals its own plain sgemm.
  const int batch = 3;
  std::vector<float> BA(m * k * batch), BB(k * n * batch), BC(m * n * batch, 0.0f);
  for (size_t i = 0; i < BA.size(); ++i) BA[i] = float(i % 11) - 5.0f;
  for (size_t i = 0; i < BB.size(); ++i) BB[i] = float(i % 3) * 0.25f;
  la->sgemm_strided_batched(gpu::Op::kN, gpu::Op::kN, m, n, k, 1.0f, BA.data(), m, m * k, BB.data(), k, k * n, 0.0f,
                            BC.data(), m, m * n, batch);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        float want = 0;
        for (int p = 0; p < k; ++p) want += BA[b * m * k + p * m + i] * BB[b * k * n + j * k + p];
        EXPECT_FLOAT_EQ(BC[b * m * n + j * m + i], want) << b << ":" << i << "," << j;
      }
  std::vector<float> S(m * m, 0.0f);  // S = A Aᵀ, lower triangle
  la->ssyrk(gpu::Fill::kLower, gpu::Op::kN, m, k, 1.0f, A.data(), m, 0.0f, S.data(), m);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j <= i; ++j) {
      float want = 0;
      for (int p = 0; p < k; ++p) want += A[p * m + i] * A[p * m + j];
      EXPECT_FLOAT_EQ(S[j * m + i], want);
    }
  std::vector<float> L = {2, 1, 3, 0, 4, 5, 0, 0, 6}, X(2 * 3), Y(2 * 3);  // L lower 3x3 column-major
  for (size_t i = 0; i < X.size(); ++i) X[i] = float(i) + 1.0f;
  la->strmm(gpu::Side::kRight, gpu::Fill::kLower, gpu::Op::kN, 2, 3, 1.0f, L.data(), 3, X.data(), 2, Y.data(), 2);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      float want = 0;
      for (int p = j; p < 3; ++p) want += X[p * 2 + i] * L[j * 3 + p];
      EXPECT_FLOAT_EQ(Y[j * 2 + i], want);
    }
  std::vector<double> P = {4, 2, 2, 5};  // [[4, 2], [2, 5]] = L Lᵀ, L = [[2, 0], [1, 2]]
  EXPECT_EQ(la->dpotrf(gpu::Fill::kLower, 2, P.data(), 2), 0);
  EXPECT_DOUBLE_EQ(P[0], 2.0);
  EXPECT_DOUBLE_EQ(P[1], 1.0);
  EXPECT_DOUBLE_EQ(P[3], 2.0);
  // dpotri from that factor: [[4, 2], [2, 5]]⁻¹ = [[5, -2], [-2, 4]] / 16, lower triangle.
  EXPECT_EQ(la->dpotri(gpu::Fill::kLower, 2, P.data(), 2), 0);
  EXPECT_DOUBLE_EQ(P[0], 5.0 / 16);
  EXPECT_DOUBLE_EQ(P[1], -2.0 / 16);
  EXPECT_DOUBLE_EQ(P[3], 4.0 / 16);
  std::vector<double> Z = {0, 0, 0, 1};  // a factor with a zero on its diagonal: singular
  EXPECT_EQ(la->dpotri(gpu::Fill::kLower, 2, Z.data(), 2), 1);
  std::vector<double> Q = {1, 2, 2, 1};
  EXPECT_GT(la->dpotrf(gpu::Fill::kLower, 2, Q.data(), 2), 0);
}

// The Gram clip search in column panels (a 3 MiB device for a 900 KB weight, its Gram blocks on it):
// the same choices as the reference, and as one panel holding every column.
TEST(CudaEmulated, GramClipSearchStreamsInPanels) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto ref = make_reference_backend();
  const check::Case c{DType::kFloat16, 0, 1100, 409, 128, 4, false};
  const check::Weight w = check::make_weight(c, 5);
  const int64_t K = c.K, B = c.block, G = num_blocks(K, B);
  const auto gram = check::gram(300, K, 31);
  std::vector<double> blocks(size_t(G * B * B), 0.0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < B && g * B + i < K; ++i)
      for (int64_t j = 0; j < B && g * B + j < K; ++j)
        blocks[size_t((g * B + i) * B + j)] = gram[size_t((g * B + i) * K + g * B + j)];
  const GramClipOptions opt{{1.0f, 0.9f, 0.8f, 0.7f, 0.6f}, true};
  QuantResult want, narrow, wide;
  const Tensor bt = host_view(DType::kFloat64, {G, B, B}, blocks.data());
  ref->clip_quantize_gram(w.m, c.spec(), bt, B, nullptr, opt, want);
  auto small = emulated(3u << 20), big = emulated(1u << 30);
  small->clip_quantize_gram(w.m, c.spec(), bt, B, nullptr, opt, narrow);
  big->clip_quantize_gram(w.m, c.spec(), bt, B, nullptr, opt, wide);
  EXPECT_EQ(want.codes, narrow.codes);
  EXPECT_EQ(want.scales, narrow.scales);
  EXPECT_EQ(wide.codes, narrow.codes);
  EXPECT_EQ(wide.scales, narrow.scales);
  EXPECT_LE(small->device_memory().peak, uint64_t(3u << 20));
  // More than one panel: a single one would need the whole weight's D and E (2 x 4.5 MB).
  EXPECT_GT(big->device_memory().peak, uint64_t(3u << 20));
}

// The clip search's float products are part of its definition: the device issues the CPU backend's
// (tiles of kGramClipColumns columns, the partial last block as its own product), so the two make the
// same choices even on near-ties. Ratios 1e-4 apart make near-ties common: OpenBLAS sums a product in an
// order that depends on its shape, and with one product per block over the whole panel (the device's
// earlier form) this weight's codes differed. Both layouts, fp32 (no rounding to a narrow type hides
// the last bits), a partial last block, panels of 256 and 512 columns and one panel of all 700.
TEST(CudaEmulated, GramClipSearchIssuesTheCpuBackendsProducts) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto cpu = make_cpu_backend();
  GramClipOptions opt{{}, true};
  for (int i = 0; i < 12; ++i) opt.ratios.push_back(1.0f - 1e-6f * float(i));
  for (int k_axis : {0, 1}) {
    const check::Case c{DType::kFloat32, k_axis, 1100, 700, 128, 4, false};
    const check::Weight w = check::make_weight(c, 17 + k_axis);
    const auto gram = check::gram(400, c.K, 43);
    QuantResult want;
    const Tensor gt = host_view(DType::kFloat64, {c.K, c.K}, gram.data());
    cpu->clip_quantize_gram(w.m, c.spec(), gt, 0, nullptr, opt, want);
    for (uint64_t budget : {uint64_t(8) << 20, uint64_t(11) << 20, uint64_t(1) << 30}) {
      QuantResult got;
      emulated(budget)->clip_quantize_gram(w.m, c.spec(), gt, 0, nullptr, opt, got);
      EXPECT_EQ(want.codes, got.codes) << "k_axis " << k_axis << ", budget " << budget;
      EXPECT_EQ(want.scales, got.scales) << "k_axis " << k_axis << ", budget " << budget;
    }
  }
}

// A weight larger than the device budget quantizes in column panels: the same bits as the reference,
// and the device never held more than its budget.
TEST(CudaEmulated, WeightsLargerThanTheBudgetStreamInPanels) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto ref = make_reference_backend();
  const uint64_t budget = 512u << 10;
  for (int k_axis : {0, 1}) {
    const check::Case c{DType::kFloat16, k_axis, 1100, 409, 128, 4, k_axis == 1};  // 900 KB of fp16
    const check::Weight w = check::make_weight(c, 3);
    auto dev = emulated(budget);
    QuantResult a, b;
    ref->rtn(w.m, c.spec(), a);
    dev->rtn(w.m, c.spec(), b);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.zero_points, b.zero_points);
    // An fp16 weight's block errors summed in float; on k_axis 1 the device adds its lanes' sums.
    EXPECT_NEAR(a.sq_error, b.sq_error, (k_axis == 0 ? 1e-12 : 2e-4) * a.sq_error);
    const auto cw = check::positive(c.K, 0.1f, 2.0f, 4);
    ref->rtn_weighted(w.m, c.spec(), cw.data(), {1.0f, 0.9f}, a);
    dev->rtn_weighted(w.m, c.spec(), cw.data(), {1.0f, 0.9f}, b);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(ref->download(ref->scale_weight(w.m, cw.data()).tensor()),
              dev->download(dev->scale_weight(w.m, cw.data()).tensor()));
    EXPECT_GT(dev->device_memory().peak, budget / 2);
    EXPECT_LE(dev->device_memory().peak, budget);
  }
  // Not even one column fits: one clear error.
  const check::Case big{DType::kFloat32, 0, 40000, 4, 128, 4, false};
  const check::Weight w = check::make_weight(big, 1);
  QuantResult q;
  try {
    emulated(64u << 10)->rtn(w.m, big.spec(), q);
    FAIL() << "quantized beyond the budget";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--device_memory"), std::string::npos) << e.what();
  }
}

// A Gram matrix larger than the budget streams in row panels; the loss stays within its bound of the
// reference, and does not depend on the budget beyond BLAS summation order.
TEST(CudaEmulated, GramMatricesLargerThanTheBudgetStreamInRowPanels) {
  if (!cuda_emulated_compiled()) GTEST_SKIP() << "no CCCL headers at configure time";
  auto ref = make_reference_backend();
  const int64_t K = 384;  // XᵀX: 576 KiB of float32
  const check::Case c{DType::kFloat32, 0, K, 96, 128, 4, false};
  const check::Weight w = check::make_weight(c, 9);
  const auto gram = check::gram(500, K, 2);
  const std::vector<float> g32(gram.begin(), gram.end());
  const GramFactor upper = ref->gram_cholesky_upper(kernels::host_view(DType::kFloat64, {K, K}, gram.data()));
  const auto s = check::positive(K, 0.5f, 2.0f, 1);
  for (bool factor : {false, true}) {
    const GramForm form{K, 500, host_view(DType::kFloat32, {K, K}, g32.data()), factor ? upper.upper : Tensor{}};
    const double want = ref->awq_losses(w.m, {s.data()}, c.spec(), form, nullptr)[0];
    for (uint64_t budget : {uint64_t(4) << 20, uint64_t(400) << 10}) {
      auto dev = emulated(budget);
      const double got = dev->awq_losses(w.m, {s.data()}, c.spec(), form, nullptr)[0];
      EXPECT_NEAR(got, want, 2e-4 * want) << "factor " << factor << " budget " << budget;
      EXPECT_LE(dev->device_memory().peak, budget);
    }
  }
  // Too large to factor within the budget: no factor, so the Gram form (which streams) is used.
  const Tensor g64 = kernels::host_view(DType::kFloat64, {K, K}, gram.data());
  EXPECT_FALSE(emulated(1u << 20)->gram_cholesky_upper(g64).ok());
  EXPECT_EQ(emulated(8u << 20)->gram_cholesky_upper(g64).upper.elements(), K * K);
}

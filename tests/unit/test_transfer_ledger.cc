// The CUDA backend's transfer ledger on the emulated device (which counts exactly what a GPU would
// move): what each operation uploads, brings back and allocates, and the arrays it keeps on the device
// so that a weight crosses the bus once. Results are compared with the CPU backend's, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

constexpr int64_t K = 256, N = 96, kBlock = 32, G = K / kBlock;

std::unique_ptr<Backend> emulated(uint64_t budget = uint64_t(64) << 20) {
  return make_backend(BackendOptions{Device::kCudaEmulated, budget}, nullptr);
}

OpTransfers op(const Backend& b, const std::string& name) {
  const TransferLedger* l = b.transfer_ledger();
  EXPECT_NE(l, nullptr);
  const auto it = l->ops.find(name);
  return it == l->ops.end() ? OpTransfers{} : it->second;
}

// An fp16 [K, N] weight with a few outliers.
struct Fp16Weight {
  std::vector<uint16_t> bits;
  WeightMatrix m;
  Fp16Weight() : bits(size_t(K * N)) {
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_half(i % 97 == 0 ? 0.3f : d(rng));
    m = WeightMatrix{DType::kFloat16, bits.data(), K, N, 0};
  }
  uint64_t bytes() const { return bits.size() * 2; }
};

void expect_same(const QuantResult& a, const QuantResult& b) {
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.zero_points, b.zero_points);
}

}  // namespace

TEST(TransferLedger, CpuHasNone) { EXPECT_EQ(make_cpu_backend()->transfer_ledger(), nullptr); }

// The default RTN: the weight goes up once; the codes come back packed (half a byte each), with the
// scales (in their fp16 type) and the error sum: nothing else crosses the bus.
TEST(TransferLedger, RtnLsqMovesTheWeightOnceAndPackedCodesBack) {
  const Fp16Weight w;
  auto gpu = emulated();
  const QuantSpec spec{4, kBlock, false};
  QuantResult got, want;
  gpu->rtn_lsq(w.m, spec, RtnSearchOptions{FitWeight::kMagnitude}, got);
  make_cpu_backend()->rtn_lsq(w.m, spec, RtnSearchOptions{FitWeight::kMagnitude}, want);
  expect_same(got, want);
  const OpTransfers t = op(*gpu, "rtn_lsq");
  EXPECT_EQ(t.h2d_bytes, w.bytes());
  EXPECT_EQ(t.d2h_bytes, uint64_t(K * N / 2 + G * N * 2 + 8));  // fp16 scales as fp16; one error sum
  EXPECT_FALSE(t.host_fallback);
  EXPECT_GT(t.launches, 0u);
  // The writer's packing is what came back: no transfer at all.
  EXPECT_EQ(gpu->pack_onnx_codes(got, 4), make_cpu_backend()->pack_onnx(want.codes, 4));
  EXPECT_EQ(op(*gpu, "pack_onnx").calls, 0u);
}

// The pooled allocator: a second weight of the same shape allocates nothing new.
TEST(TransferLedger, SecondWeightOfAShapeAllocatesNothing) {
  const Fp16Weight w;
  auto gpu = emulated();
  QuantResult q;
  gpu->rtn(w.m, QuantSpec{4, kBlock, true}, q);
  const uint64_t first = gpu->transfer_ledger()->total.allocations;
  EXPECT_GT(first, 0u);
  for (int i = 0; i < 3; ++i) gpu->rtn(w.m, QuantSpec{4, kBlock, true}, q);
  EXPECT_EQ(gpu->transfer_ledger()->total.allocations, first);
  EXPECT_LE(gpu->device_memory().peak, gpu->device_memory().budget);
}

// An uploaded weight is read in place by every operation given it.
TEST(TransferLedger, UploadedWeightIsReadInPlace) {
  const Fp16Weight w;
  auto gpu = emulated();
  const WeightMatrix kept = gpu->upload_weight(w.m);
  ASSERT_TRUE(kept.buffer);
  EXPECT_EQ(op(*gpu, "upload").h2d_bytes, w.bytes());
  QuantResult a, b;
  gpu->rtn(kept, QuantSpec{4, kBlock, false}, a);
  const std::vector<float> mean = gpu->awq_weight_mean(kept, kBlock, true);
  EXPECT_EQ(op(*gpu, "rtn").h2d_bytes, 0u);
  EXPECT_EQ(op(*gpu, "awq_weight_mean").h2d_bytes, 0u);
  auto cpu = make_cpu_backend();
  cpu->rtn(w.m, QuantSpec{4, kBlock, false}, b);
  expect_same(a, b);
  EXPECT_EQ(mean, cpu->awq_weight_mean(w.m, kBlock, true));
  // Beyond half the budget it is not uploaded (the operations stream it in panels instead).
  auto small = emulated(w.bytes());
  EXPECT_FALSE(small->upload_weight(w.m).buffer);
}

// AWQ's W ⊙ s stays on the device for the quantizer: the fp32 weight never crosses the bus, whichever
// operation reads it (rtn_weighted, hqq).
TEST(TransferLedger, ScaledWeightStaysOnTheDevice) {
  const Fp16Weight w;
  std::vector<float> s(static_cast<size_t>(K)), energy(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) s[size_t(k)] = 0.5f + float(k % 7) * 0.25f, energy[size_t(k)] = 1.0f + float(k % 5);
  auto gpu = emulated();
  auto cpu = make_cpu_backend();
  const WeightMatrix gs = gpu->scale_weight_f32(w.m, s.data());
  const WeightMatrix cs = cpu->scale_weight_f32(w.m, s.data());
  EXPECT_EQ(gs.data, nullptr);
  EXPECT_TRUE(gs.buffer);
  EXPECT_TRUE(cs.data && cs.buffer);  // host memory the CPU's result owns
  EXPECT_EQ(gs.dtype, DType::kFloat32);
  EXPECT_EQ(op(*gpu, "scale_weight_f32").h2d_bytes, w.bytes() + uint64_t(K) * 4);
  EXPECT_EQ(op(*gpu, "scale_weight_f32").d2h_bytes, 0u);
  QuantSpec spec{4, kBlock, false};
  spec.scale_dtype = DType::kFloat16;
  QuantResult a, b;
  gpu->rtn_weighted(gs, spec, energy.data(), {1.0f, 0.9f, 0.8f}, a);
  cpu->rtn_weighted(cs, spec, energy.data(), {1.0f, 0.9f, 0.8f}, b);
  expect_same(a, b);
  EXPECT_EQ(op(*gpu, "rtn_weighted").h2d_bytes, uint64_t(K) * 4 + 3 * 4);  // the channel weights and ratios
  QuantResult h1, h2;
  gpu->hqq(gs, QuantSpec{4, kBlock, true}, HqqOptions{}, h1);
  cpu->hqq(cs, QuantSpec{4, kBlock, true}, HqqOptions{}, h2);
  expect_same(h1, h2);
  EXPECT_FALSE(op(*gpu, "hqq").host_fallback);
  EXPECT_EQ(op(*gpu, "hqq").h2d_bytes, 0u);
  // Packed codes, fp32 scales, zero points and the error sum.
  EXPECT_EQ(op(*gpu, "hqq").d2h_bytes, uint64_t(K * N / 2 + G * N * (4 + 1) + 8));
}

// The Cholesky factor left on the device gives the AWQ loss of the host factor, without its upload.
TEST(TransferLedger, DeviceCholeskyFactorIsReadInPlace) {
  const Fp16Weight w;
  std::mt19937 rng(9);
  std::normal_distribution<float> d;
  const int64_t T = 2 * K;
  std::vector<float> x(size_t(T * K));
  for (float& v : x) v = d(rng);
  std::vector<double> gram(size_t(K * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) gram[size_t(i * K + j)] += double(x[size_t(t * K + i)]) * x[size_t(t * K + j)];
  std::vector<float> g32(gram.begin(), gram.end());
  const std::vector<float> s(static_cast<size_t>(K), 1.0f);
  auto gpu = emulated();
  const QuantSpec spec{4, kBlock, false};
  const GramFactor f = gpu->gram_cholesky_upper(kernels::host_view(DType::kFloat64, {K, K}, gram.data()));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.upper.data, nullptr);
  EXPECT_EQ(op(*gpu, "gram_cholesky_upper").d2h_bytes, 0u);
  const std::vector<uint8_t> upper = gpu->download(f.upper);
  EXPECT_EQ(op(*gpu, "download").d2h_bytes, uint64_t(K * K) * 4);
  const Tensor g32t = host_view(DType::kFloat32, {K, K}, g32.data());
  const std::vector<double> host_form = gpu->awq_losses(
      w.m, {s.data()}, spec, GramForm{K, T, g32t, host_view(DType::kFloat32, {K, K}, upper.data())}, nullptr);
  const uint64_t up_before = op(*gpu, "awq_losses").h2d_bytes;
  const std::vector<double> kept_form = gpu->awq_losses(w.m, {s.data()}, spec, GramForm{K, T, g32t, f.upper}, nullptr);
  EXPECT_EQ(host_form, kept_form);
  EXPECT_EQ(op(*gpu, "awq_losses").h2d_bytes - up_before, up_before - uint64_t(K * K) * 4);
}

// The GEMM form's Gram matrix uploaded: once, read in place by every
// loss of the sibling weights, with the same losses as the host form.
TEST(TransferLedger, KeptGramIsReadInPlace) {
  const Fp16Weight w;
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  std::vector<float> g32(size_t(K * K));
  for (int64_t i = 0; i < K; ++i)  // symmetric, dominant diagonal
    for (int64_t j = 0; j <= i; ++j) g32[size_t(i * K + j)] = g32[size_t(j * K + i)] = i == j ? 50.0f + d(rng) : 0.1f * d(rng);
  const std::vector<float> s(static_cast<size_t>(K), 1.0f);
  auto gpu = emulated();
  const QuantSpec spec{4, kBlock, false};
  GramForm host_form;
  host_form.K = K;
  host_form.rows = 2 * K;
  host_form.gram = host_view(DType::kFloat32, {K, K}, g32.data());
  const std::vector<double> want = gpu->awq_losses(w.m, {s.data()}, spec, host_form, nullptr);
  const uint64_t up_host = op(*gpu, "awq_losses").h2d_bytes;
  GramForm kept = host_form;
  kept.gram = gpu->upload(host_form.gram);
  ASSERT_TRUE(kept.gram.buffer);
  EXPECT_EQ(op(*gpu, "upload").h2d_bytes, uint64_t(K * K) * 4);
  const WeightMatrix kw = gpu->upload_weight(w.m);
  for (int rep = 0; rep < 2; ++rep) EXPECT_EQ(gpu->awq_losses(kw, {s.data()}, spec, kept, nullptr), want);
  // Per loss, with the weight and G on the device, only the candidate scale goes up (G's diagonal is
  // copied on the device).
  const uint64_t per_loss = (op(*gpu, "awq_losses").h2d_bytes - up_host) / 2;
  EXPECT_EQ(per_loss, up_host - uint64_t(K * K) * 4 - uint64_t(K) * 4 - w.bytes());
  // The CPU keeps nothing: a tensor there is host memory.
  auto cpu = make_cpu_backend();
  EXPECT_FALSE(cpu->upload(host_form.gram).buffer);
}

// A Gram matrix the factorisation cannot take (a float32-accumulated XᵀX can come out slightly indefinite;
// here one pair of channels plainly so, which no diagonal shift of the retries repairs): the float32 copy
// the attempt uploaded is kept for the GEMM form (GramFactor::gram), which reads it in place and
// gives the losses of the host form; nothing goes up a second time.
TEST(TransferLedger, UnfactorisableGramServesTheGemmForm) {
  const Fp16Weight w;
  constexpr int64_t T = 64;
  std::vector<double> g64(size_t(K * K), 0.0);
  std::vector<float> g32(size_t(K * K), 0.0f);
  for (int64_t i = 0; i < K; ++i) g64[size_t(i * K + i)] = g32[size_t(i * K + i)] = 4.0f + float(i % 5);
  g64[size_t(1)] = g64[size_t(K)] = g32[size_t(1)] = g32[size_t(K)] = 40.0f;  // channels 0 and 1: indefinite
  auto gpu = emulated();
  GramFactor f = gpu->gram_cholesky_upper(kernels::host_view(DType::kFloat64, {K, K}, g64.data()));
  EXPECT_FALSE(f.ok());
  ASSERT_TRUE(f.gram.buffer);
  EXPECT_EQ(op(*gpu, "gram_cholesky_upper").h2d_bytes, uint64_t(K * K) * 4);  // once, as float32
  const std::vector<float> s(static_cast<size_t>(K), 1.0f);
  const QuantSpec spec{4, kBlock, false};
  GramForm host_form;
  host_form.K = K;
  host_form.rows = T;
  host_form.gram = host_view(DType::kFloat32, {K, K}, g32.data());
  GramForm kept = host_form;
  kept.gram.buffer = f.gram.buffer;
  const std::vector<double> want = make_cpu_backend()->awq_losses(w.m, {s.data()}, spec, host_form, nullptr);
  const std::vector<double> got = gpu->awq_losses(w.m, {s.data()}, spec, kept, nullptr);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_NEAR(got[0], want[0], 1e-6 * std::abs(want[0]));  // BLAS products: the same values, another order
  EXPECT_EQ(gpu->awq_losses(w.m, {s.data()}, spec, host_form, nullptr), got);  // as if G had gone up again
  EXPECT_EQ(op(*gpu, "upload").calls, 0u);
  f = {};
  kept = {};
}

// A Gram matrix whose values float32 holds exactly (the calibration accumulates XᵀX in float32) goes up as
// float32 for the factorisation, half its float64 bytes, and gives the CPU's factor bit for bit; one that
// float32 does not hold goes up as float64, also the CPU's factor.
TEST(TransferLedger, CholeskyGramGoesUpAsFloat32WhereExact) {
  std::mt19937 rng(13);
  std::normal_distribution<float> d;
  std::vector<float> g32(size_t(K * K));
  for (int64_t i = 0; i < K; ++i)  // symmetric, dominant diagonal
    for (int64_t j = 0; j <= i; ++j) g32[size_t(i * K + j)] = g32[size_t(j * K + i)] = i == j ? 50.0f + d(rng) : 0.1f * d(rng);
  auto cpu = make_cpu_backend();
  for (const bool exact : {true, false}) {
    std::vector<double> gram(g32.begin(), g32.end());
    if (!exact) gram[size_t(3 * K + 3)] += 1e-12;  // one value float32 cannot hold
    auto gpu = emulated();
    const Tensor g64 = kernels::host_view(DType::kFloat64, {K, K}, gram.data());
    const std::vector<uint8_t> got = gpu->download(gpu->gram_cholesky_upper(g64).upper);
    EXPECT_EQ(got, cpu->download(cpu->gram_cholesky_upper(g64).upper)) << "exact " << exact;
    EXPECT_EQ(op(*gpu, "gram_cholesky_upper").h2d_bytes, uint64_t(K * K) * (exact ? 4 : 8)) << "exact " << exact;
  }
}

// awq_clip's Gram blocks uploaded for the sibling weights of one activation (a float64 tensor): once,
// as float32 where exact, and every clip search that reads them gives the codes it gives with the host's.
TEST(TransferLedger, KeptGramBlocksAreUploadedOnce) {
  const Fp16Weight w;
  std::mt19937 rng(17);
  std::normal_distribution<float> d;
  std::vector<double> blocks(size_t(G * kBlock * kBlock));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < kBlock; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const float v = i == j ? 20.0f + d(rng) : 0.1f * d(rng);
        blocks[size_t((g * kBlock + i) * kBlock + j)] = blocks[size_t((g * kBlock + j) * kBlock + i)] = v;
      }
  const QuantSpec spec{4, kBlock, false};
  GramClipOptions opt;
  opt.ratios = {1.0f, 0.9f, 0.8f};
  QuantResult want, got;
  const Tensor host_blocks = host_view(DType::kFloat64, {G, kBlock, kBlock}, blocks.data());
  make_cpu_backend()->clip_quantize_gram(w.m, spec, host_blocks, kBlock, nullptr, opt, want);
  auto gpu = emulated();
  Tensor kept = gpu->upload(host_blocks);
  ASSERT_TRUE(kept.buffer);
  EXPECT_EQ(op(*gpu, "upload").h2d_bytes, blocks.size() * 4);
  for (int rep = 0; rep < 2; ++rep) {
    gpu->clip_quantize_gram(w.m, spec, kept, kBlock, nullptr, opt, got);
    expect_same(want, got);
  }
  // Per weight only the weight and the candidate ratios go up.
  EXPECT_EQ(op(*gpu, "clip_quantize_gram").h2d_bytes, 2 * (w.bytes() + opt.ratios.size() * 4));
  EXPECT_FALSE(make_cpu_backend()->upload(host_blocks).buffer);
  kept.release();  // a handle goes before the backend that holds its memory
}

// W ⊙ s from the copy the search kept: only s goes up, even beside the other weights a whole-model search
// holds for the quantizer (here three weights, more than a quarter of the budget, below half of it).
TEST(TransferLedger, ScaledKeptWeightUploadsOnlyTheScale) {
  const Fp16Weight w;
  std::vector<float> s(static_cast<size_t>(K)), energy(static_cast<size_t>(K), 1.0f);
  for (int64_t k = 0; k < K; ++k) s[size_t(k)] = 0.5f + float(k % 7) * 0.25f;
  auto gpu = emulated(512 << 10);
  std::vector<WeightMatrix> held;
  for (int i = 0; i < 3; ++i) held.push_back(gpu->upload_weight(w.m));
  for (const auto& h : held) ASSERT_TRUE(h.buffer);
  const WeightMatrix gs = gpu->scale_weight_f32(held[0], s.data());
  EXPECT_EQ(gs.data, nullptr);
  EXPECT_EQ(op(*gpu, "scale_weight_f32").h2d_bytes, uint64_t(K) * 4);
  EXPECT_EQ(op(*gpu, "scale_weight_f32").d2h_bytes, 0u);
  auto cpu = make_cpu_backend();
  const WeightMatrix cs = cpu->scale_weight_f32(w.m, s.data());
  QuantSpec spec{4, kBlock, false};
  spec.scale_dtype = DType::kFloat16;
  QuantResult a, b;
  gpu->rtn_weighted(gs, spec, energy.data(), {1.0f, 0.9f}, a);
  cpu->rtn_weighted(cs, spec, energy.data(), {1.0f, 0.9f}, b);
  expect_same(a, b);
}

// Weights held together (a whole-model search's, for the quantizer) share one room: one allocation for all,
// each still uploaded once and read in place; a piece given back serves the next weight, and a full room
// refuses (nothing is uploaded). The CPU keeps nothing and reserves nothing.
TEST(TransferLedger, HeldWeightsShareOneRoom) {
  const Fp16Weight w;
  auto gpu = emulated();
  const std::shared_ptr<Buffer> room = gpu->reserve({w.bytes(), w.bytes(), w.bytes()});
  ASSERT_TRUE(room);
  EXPECT_EQ(op(*gpu, "reserve").allocations, 1u);
  const auto into_room = [&](const WeightMatrix& m) { return WeightMatrix::of(gpu->upload_into(m.tensor(), room), 0); };
  std::vector<WeightMatrix> held;
  for (int i = 0; i < 3; ++i) held.push_back(into_room(w.m));
  for (const auto& h : held) ASSERT_TRUE(h.buffer);
  EXPECT_FALSE(into_room(w.m).buffer);  // full
  EXPECT_EQ(op(*gpu, "upload").allocations, 0u);
  EXPECT_EQ(op(*gpu, "upload").h2d_bytes, 3 * w.bytes());
  QuantResult a, b;
  gpu->rtn(held[1], QuantSpec{4, kBlock, true}, a);
  make_cpu_backend()->rtn(w.m, QuantSpec{4, kBlock, true}, b);
  expect_same(a, b);
  EXPECT_EQ(op(*gpu, "rtn").h2d_bytes, 0u);
  held[1] = WeightMatrix{};  // its piece goes back to the room
  const WeightMatrix again = into_room(w.m);
  EXPECT_TRUE(again.buffer);
  EXPECT_EQ(op(*gpu, "upload").allocations, 0u);
  EXPECT_EQ(gpu->transfer_ledger()->ops.at("reserve").allocations, 1u);
  // More than the budget holds: no room.
  EXPECT_FALSE(emulated(w.bytes())->reserve({w.bytes(), w.bytes()}));
  auto cpu = make_cpu_backend();
  EXPECT_FALSE(cpu->reserve({w.bytes()}));
  EXPECT_FALSE(cpu->upload_into(w.m.tensor(), room).buffer);
}

namespace {

// The MatMulNBits packings of a result the device kept (QuantResult::keep) against the CPU's.
void expect_kept_result_packs_as_the_cpu(const WeightMatrix& wm, bool zero_point, uint64_t budget) {
  auto gpu = emulated(budget);
  QuantSpec spec{4, kBlock, zero_point};
  QuantResult got, want;
  got.keep = true;
  if (zero_point) {
    gpu->hqq(wm, spec, HqqOptions{}, got);
    make_cpu_backend()->hqq(wm, spec, HqqOptions{}, want);
  } else {
    gpu->rtn_lsq(wm, spec, RtnSearchOptions{FitWeight::kMagnitude}, got);
    make_cpu_backend()->rtn_lsq(wm, spec, RtnSearchOptions{FitWeight::kMagnitude}, want);
  }
  ASSERT_TRUE(got.kept.buffer);
  EXPECT_TRUE(got.codes.empty() && got.packed.empty() && got.scales.empty() && got.zero_points.empty());
  EXPECT_EQ(got.sq_error, want.sq_error);
  EXPECT_EQ(got.groups, want.groups);
  const OpTransfers q = op(*gpu, zero_point ? "hqq" : "rtn_lsq");
  EXPECT_EQ(q.d2h_bytes, 8u);  // the error sum alone
  auto cpu = make_cpu_backend();
  EXPECT_EQ(gpu->pack_matmulnbits_weight(wm, spec, got, kBlock), cpu->pack_matmulnbits_weight(wm, spec, want, kBlock));
  EXPECT_EQ(gpu->matmulnbits_scales(wm, got), cpu->matmulnbits_scales(wm, want));
  if (zero_point) {
    EXPECT_EQ(gpu->pack_matmulnbits_zero_points(wm, spec, got), cpu->pack_matmulnbits_zero_points(wm, spec, want));
  }
  const uint64_t n = uint64_t(wm.rows * wm.cols), GN = uint64_t(G * wm.N());
  for (const char* o : {"pack_matmulnbits_weight", "matmulnbits_scales", "pack_matmulnbits_zero_points"})
    EXPECT_EQ(op(*gpu, o).h2d_bytes, 0u) << o;
  EXPECT_EQ(op(*gpu, "pack_matmulnbits_weight").d2h_bytes, n / 2);
  EXPECT_EQ(op(*gpu, "matmulnbits_scales").d2h_bytes, GN * 2);  // fp16 scales in their type
  EXPECT_THROW(gpu->pack_onnx_codes(got, 4), std::invalid_argument);  // the host has no codes to pack
}

}  // namespace

// The codes stay on the device from the quantizer to the MatMulNBits packing: nothing goes up for the
// packing, only B, the scales and the zero points come back; both layouts, with and without zero points,
// and in column panels (a budget below the weight).
TEST(TransferLedger, KeptResultIsPackedWhereTheQuantizerLeftIt) {
  const Fp16Weight w;
  expect_kept_result_packs_as_the_cpu(w.m, false, uint64_t(64) << 20);
  expect_kept_result_packs_as_the_cpu(w.m, true, uint64_t(64) << 20);
  expect_kept_result_packs_as_the_cpu(w.m, true, 96 << 10);  // panels of 32 columns
  WeightMatrix nk = w.m;  // the same bytes read as [N, K] (Gemm transB)
  nk.rows = N, nk.cols = K, nk.k_axis = 1;
  expect_kept_result_packs_as_the_cpu(nk, false, uint64_t(64) << 20);
  expect_kept_result_packs_as_the_cpu(nk, true, 96 << 10);
}

// A result kept on the device brings no scales back for the host to check: a weight holding NaN or Inf still
// shows in its error sum, which the pipeline turns into its "holds NaN or Inf values" error.
TEST(TransferLedger, KeptResultOfANonFiniteWeightHasANonFiniteError) {
  Fp16Weight w;
  w.bits[5 * N + 3] = 0x7c00;  // +Inf
  w.bits[9 * N + 40] = 0x7e00;  // NaN
  auto gpu = emulated();
  for (bool zp : {false, true}) {
    QuantSpec spec{4, kBlock, zp};
    QuantResult q;
    q.keep = true;
    if (zp)
      gpu->hqq(w.m, spec, HqqOptions{}, q);
    else
      gpu->rtn_lsq(w.m, spec, RtnSearchOptions{FitWeight::kMagnitude}, q);
    ASSERT_TRUE(q.kept.buffer);
    EXPECT_FALSE(std::isfinite(q.sq_error)) << "zp " << zp;
  }
}

// The staging ring's depth on the emulated device (which runs the real device's ring logic,
// kernels/cuda/device.cc): while the host fills one pinned buffer, the uploads of the two before it are
// still queued, for an operation's own copies and for the next weight's prefetch alike; the ledger's
// bytes and chunks are those of the copies, whatever the depth.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "host/run/report.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "kernels/dtype.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

constexpr size_t kChunk = 4096;

OpTransfers op(const Backend& b, const std::string& name) {
  const auto it = b.transfer_ledger()->ops.find(name);
  return it == b.transfer_ledger()->ops.end() ? OpTransfers{} : it->second;
}

// An fp16 weight [K, N] of normal values.
struct Weight {
  std::vector<uint16_t> bits;
  WeightMatrix m;
  Weight(int64_t K, int64_t N, uint32_t seed) : bits(size_t(K * N)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (auto& b : bits) b = float_to_half(d(rng));
    m = WeightMatrix{DType::kFloat16, bits.data(), K, N, 0};
  }
  uint64_t bytes() const { return bits.size() * 2; }
};

}  // namespace

// 10 chunks and a piece up: from the third chunk on, two uploads are in flight while the host fills the
// next buffer; a copy of one or two chunks never has more in flight than it has chunks before it. The
// bytes come back as they went, and the ledger counts them once.
TEST(StagingRing, KeepsTwoUploadsInFlight) {
  static_assert(gpu::DeviceLayer::kStagingSlots >= 3, "two uploads in flight need a third buffer to fill");
  auto dev = gpu::make_emulated_device(8u << 20, kChunk);
  const size_t n = 10 * kChunk + 17;
  std::vector<uint8_t> src(n);
  std::mt19937 rng(3);
  for (auto& b : src) b = uint8_t(rng());
  gpu::DeviceBuffer<uint8_t> d(*dev, n);
  dev->to_device(d.get(), src.data(), kChunk);  // one chunk: nothing before it
  EXPECT_EQ(dev->ledger().total.uploads_in_flight, 0u);
  {
    const gpu::OpScope scope(*dev, "two_chunks");
    dev->to_host(std::vector<uint8_t>(kChunk).data(), d.get(), kChunk);  // a sync point: the ring is empty
    dev->to_device(d.get(), src.data(), 2 * kChunk);
  }
  EXPECT_EQ(dev->ledger().ops.at("two_chunks").uploads_in_flight, 1u);
  {
    const gpu::OpScope scope(*dev, "eleven_chunks");
    dev->to_device(d.get(), src.data(), n);
  }
  std::vector<uint8_t> back(n, 0);
  dev->to_host(back.data(), d.get(), n);
  EXPECT_EQ(back, src);
  const OpTransfers t = dev->ledger().ops.at("eleven_chunks");
  EXPECT_EQ(t.uploads_in_flight, 2u);
  EXPECT_EQ(t.h2d_bytes, n);
  EXPECT_EQ(t.staged_bytes, n);
  EXPECT_EQ(t.staging_chunks, 11u);
  EXPECT_EQ(dev->ledger().total.uploads_in_flight, 2u);
  EXPECT_EQ(dev->ledger().total.h2d_bytes, kChunk + 2 * kChunk + n);
  EXPECT_EQ(dev->ledger().total.d2h_bytes, kChunk + n);
}

// The pipeline's order for two weights (upload the next, quantize this one, then the next from its copy),
// through 4 KiB buffers: the prefetch and the operation's own upload each keep two chunks in flight; the
// ledger's bytes are what the weights and results weigh (each weight up once, packed codes, fp16 scales
// and one error sum back), the report carries the depth, and the codes are the CPU's.
TEST(StagingRing, PrefetchAndUploadKeepTwoInFlightWithTheSameBytes) {
  constexpr int64_t K = 256, N = 96, G = K / 32;
  const Weight w0(K, N, 1), w1(K, N, 2);
  auto gpu = gpu::make_emulated_cuda_backend(gpu::make_emulated_device(uint64_t(64) << 20, kChunk), make_cpu_backend());
  auto cpu = make_cpu_backend();
  const QuantSpec spec{4, 32, false};
  const WeightMatrix k1 = gpu->upload_weight(w1.m);
  ASSERT_TRUE(k1.buffer);
  QuantResult g0, g1, c0, c1;
  const RtnSearchOptions opt{FitWeight::kMagnitude};
  gpu->rtn_lsq(w0.m, spec, opt, g0);
  gpu->rtn_lsq(k1, spec, opt, g1);
  cpu->rtn_lsq(w0.m, spec, opt, c0);
  cpu->rtn_lsq(w1.m, spec, opt, c1);
  EXPECT_EQ(g0.codes, c0.codes);
  EXPECT_EQ(g0.scales, c0.scales);
  EXPECT_EQ(g1.codes, c1.codes);
  EXPECT_EQ(g1.scales, c1.scales);
  const OpTransfers up = op(*gpu, "upload"), rtn = op(*gpu, "rtn_lsq");
  EXPECT_EQ(up.uploads_in_flight, 2u);
  EXPECT_EQ(rtn.uploads_in_flight, 2u);
  EXPECT_EQ(up.h2d_bytes, w1.bytes());
  EXPECT_EQ(up.prefetch_bytes_overlapped, w1.bytes());
  EXPECT_EQ(up.staging_chunks, w1.bytes() / kChunk);  // 49152 bytes: 12 chunks
  EXPECT_EQ(rtn.h2d_bytes, w0.bytes());               // w1 is read where the prefetch put it
  EXPECT_EQ(rtn.d2h_bytes, 2 * uint64_t(K * N / 2 + G * N * 2 + 8));
  const TransferLedger& l = *gpu->transfer_ledger();
  EXPECT_EQ(l.total.h2d_bytes, w0.bytes() + w1.bytes());
  EXPECT_EQ(l.total.staged_bytes, l.total.h2d_bytes + l.total.d2h_bytes);
  const nlohmann::json j = ledger_to_json(l);
  EXPECT_EQ(j["uploads_in_flight"], 2);
  EXPECT_EQ(j["ops"]["upload"]["uploads_in_flight"], 2);
}

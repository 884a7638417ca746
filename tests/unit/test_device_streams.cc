// The device layer's copy structure on the emulated device (which runs the real device's chunking and
// ordering logic, kernels/cuda/device.cc, with its streams executing at once): the pinned staging ring,
// prefetches of the next weight (Backend::upload), the device memory budget that refuses one, and
// asynchronous errors surfacing at a sync point with the operation named.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <stdexcept>
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

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

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

OpTransfers op(const Backend& b, const std::string& name) {
  const auto it = b.transfer_ledger()->ops.find(name);
  return it == b.transfer_ledger()->ops.end() ? OpTransfers{} : it->second;
}

void expect_same(const QuantResult& a, const QuantResult& b) {
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.zero_points, b.zero_points);
  EXPECT_EQ(a.sq_error, b.sq_error);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// 1-D copies through a ring of 4 KiB staging buffers: sizes below, at and past a chunk and not a
// multiple of it come back byte for byte; every byte went through staging, one DMA per chunk.
TEST(DeviceStreams, StagingRingRoundTripsOneDimensionalCopies) {
  auto dev = gpu::make_emulated_device(8u << 20, kChunk);
  uint64_t h2d = 0, chunks = 0;
  for (size_t n : {size_t(1), kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 17, size_t(100003)}) {
    const std::vector<uint8_t> src = pattern(n, uint32_t(n));
    gpu::DeviceBuffer<uint8_t> d(*dev, n);
    dev->to_device(d.get(), src.data(), n);
    std::vector<uint8_t> back(n, 0);
    dev->to_host(back.data(), d.get(), n);
    EXPECT_EQ(back, src) << n;
    h2d += n;
    chunks += 2 * ceil_div(n, kChunk);
  }
  const OpTransfers& t = dev->ledger().total;
  EXPECT_EQ(t.h2d_bytes, h2d);
  EXPECT_EQ(t.d2h_bytes, h2d);
  EXPECT_EQ(t.staged_bytes, 2 * h2d);
  EXPECT_EQ(t.staging_chunks, chunks);
  EXPECT_EQ(gpu::DeviceLayer::chunks_of(100003, 1, kChunk), 25u);
}

// 2-D copies between pitched arrays: whole rows per chunk when a row fits (1000-byte rows: 4 a chunk, the
// last chunk partial), pieces of a row when it does not (a 10000-byte row: 3 pieces); the bytes between
// rows of the destination stay untouched.
TEST(DeviceStreams, StagingRingChunksPitchedCopies) {
  auto dev = gpu::make_emulated_device(8u << 20, kChunk);
  struct Shape {
    size_t width, height, spitch, dpitch;
  };
  for (const Shape s : {Shape{1000, 10, 1500, 1200}, Shape{10000, 3, 10007, 10001}, Shape{8, 4096, 24, 16}}) {
    const std::vector<uint8_t> src = pattern(s.spitch * s.height, uint32_t(s.width));
    gpu::DeviceBuffer<uint8_t> d(*dev, s.dpitch * s.height);
    dev->fill_zero(d.get(), d.bytes());
    const uint64_t before = dev->ledger().total.staging_chunks;
    dev->to_device_2d(d.get(), s.dpitch, src.data(), s.spitch, s.width, s.height);
    const uint64_t up = dev->ledger().total.staging_chunks - before;
    std::vector<uint8_t> dev_image(d.bytes(), 1);
    dev->to_host(dev_image.data(), d.get(), d.bytes());
    std::vector<uint8_t> back(s.spitch * s.height, 0xee);
    dev->to_host_2d(back.data(), s.spitch, d.get(), s.dpitch, s.width, s.height);
    for (size_t r = 0; r < s.height; ++r) {
      for (size_t c = 0; c < s.width; ++c) {
        ASSERT_EQ(back[r * s.spitch + c], src[r * s.spitch + c]) << s.width << " " << r << " " << c;
        ASSERT_EQ(dev_image[r * s.dpitch + c], src[r * s.spitch + c]);
      }
      for (size_t c = s.width; c < s.dpitch; ++c) ASSERT_EQ(dev_image[r * s.dpitch + c], 0) << "padding written";
      for (size_t c = s.width; c < s.spitch; ++c) ASSERT_EQ(back[r * s.spitch + c], 0xee) << "padding written";
    }
    const uint64_t want = s.width <= kChunk ? ceil_div(s.height, kChunk / s.width) : s.height * ceil_div(s.width, kChunk);
    EXPECT_EQ(up, want) << s.width;
  }
  EXPECT_EQ(gpu::DeviceLayer::chunks_of(1000, 10, kChunk), 3u);
  EXPECT_EQ(gpu::DeviceLayer::chunks_of(10000, 3, kChunk), 9u);
}

// The pipeline's order for two weights: upload(w1) (a prefetch, not awaited), quantize w0, quantize w1 from
// its kept copy. w1 crosses the bus once, in the prefetch, which launches overlapped; the results are
// the CPU's. A weight kept and read at once is a prefetch that nothing overlapped.
TEST(DeviceStreams, NextWeightIsPrefetchedAndReadInPlace) {
  const Weight w0(256, 96, 1), w1(256, 96, 2);
  auto gpu = make_backend(BackendOptions{Device::kCudaEmulated, uint64_t(64) << 20}, nullptr);
  auto cpu = make_cpu_backend();
  const QuantSpec spec{4, 32, false};
  const RtnSearchOptions opt{FitWeight::kMagnitude};
  const WeightMatrix k1 = gpu->upload_weight(w1.m);
  ASSERT_TRUE(k1.buffer);
  QuantResult g0, g1, c0, c1;
  gpu->rtn_lsq(w0.m, spec, opt, g0);
  gpu->rtn_lsq(k1, spec, opt, g1);
  cpu->rtn_lsq(w0.m, spec, opt, c0);
  cpu->rtn_lsq(w1.m, spec, opt, c1);
  expect_same(g0, c0);
  expect_same(g1, c1);
  const TransferLedger& l = *gpu->transfer_ledger();
  EXPECT_EQ(op(*gpu, "upload").h2d_bytes, w1.bytes());
  EXPECT_EQ(op(*gpu, "upload").prefetches, 1u);
  EXPECT_EQ(op(*gpu, "upload").prefetches_overlapped, 1u);
  EXPECT_EQ(op(*gpu, "rtn_lsq").h2d_bytes, w0.bytes());  // w1 is read where the prefetch put it
  EXPECT_EQ(l.total.h2d_bytes, w0.bytes() + w1.bytes());
  EXPECT_EQ(l.total.prefetches, 1u);
  EXPECT_EQ(l.total.prefetch_bytes, w1.bytes());
  EXPECT_EQ(l.total.prefetches_overlapped, 1u);
  EXPECT_EQ(l.total.prefetch_bytes_overlapped, w1.bytes());
  EXPECT_EQ(l.total.staged_bytes, l.total.h2d_bytes + l.total.d2h_bytes);
  // Kept and read at once (AWQ's statistic): a prefetch, not overlapped.
  const WeightMatrix k0 = gpu->upload_weight(w0.m);
  ASSERT_TRUE(k0.buffer);
  EXPECT_EQ(gpu->awq_weight_mean(k0, 32, true), cpu->awq_weight_mean(w0.m, 32, true));
  EXPECT_EQ(l.total.prefetches, 2u);
  EXPECT_EQ(l.total.prefetches_overlapped, 1u);
  // The report's summary.device keeps its fields and adds these beside them.
  const nlohmann::json j = ledger_to_json(l);
  for (const char* f : {"h2d_bytes", "d2h_bytes", "allocations", "launches", "ops"}) EXPECT_TRUE(j.contains(f)) << f;
  EXPECT_EQ(j["prefetches"], 2);
  EXPECT_EQ(j["prefetches_overlapped"], 1);
  EXPECT_EQ(j["prefetch_bytes_overlapped"], w1.bytes());
  EXPECT_EQ(j["staged_bytes"], l.total.staged_bytes);
  EXPECT_EQ(j["ops"]["upload"]["prefetches"], 2);
  EXPECT_EQ(j["ops"]["rtn_lsq"]["staged_bytes"], op(*gpu, "rtn_lsq").h2d_bytes + op(*gpu, "rtn_lsq").d2h_bytes);
  EXPECT_EQ(j["ops"]["rtn_lsq"]["h2d_bytes"], w0.bytes());
}

// Two weights in flight must fit half the budget beside each other: with room for one, the next weight is
// not kept (no prefetch: its operation uploads it itself), with the same result.
TEST(DeviceStreams, BudgetRefusesAPrefetchThatDoesNotFit) {
  const Weight w0(1024, 512, 3), w1(1024, 512, 4);
  // Half of it holds one weight with upload()'s 64 KiB of slack, not two.
  const uint64_t budget = 3 * w0.bytes() + 2 * 65536;
  auto gpu = make_backend(BackendOptions{Device::kCudaEmulated, budget}, nullptr);
  WeightMatrix k0 = gpu->upload_weight(w0.m);
  ASSERT_TRUE(k0.buffer);
  const WeightMatrix k1 = gpu->upload_weight(w1.m);
  EXPECT_FALSE(k1.buffer);
  EXPECT_EQ(k1.data, w1.m.data);
  EXPECT_EQ(gpu->transfer_ledger()->total.prefetches, 1u);
  QuantResult g1, c1;
  gpu->rtn_lsq(k1, QuantSpec{4, 32, false}, RtnSearchOptions{}, g1);
  make_cpu_backend()->rtn_lsq(w1.m, QuantSpec{4, 32, false}, RtnSearchOptions{}, c1);
  expect_same(g1, c1);
  EXPECT_EQ(op(*gpu, "rtn_lsq").h2d_bytes, w1.bytes());
  EXPECT_LE(gpu->device_memory().peak, budget);
  // Once the first weight's handle is gone, the next one fits again.
  k0 = WeightMatrix{};
  EXPECT_TRUE(gpu->upload_weight(w1.m).buffer);
  EXPECT_EQ(gpu->transfer_ledger()->total.prefetches, 2u);
}

// A launch or a copy that fails on the device surfaces at the next sync point, naming the operation then
// running: "cuda_emulated: rtn_lsq: an illegal memory access was encountered ...", as a GPU's would.
TEST(DeviceStreams, AsynchronousErrorsNameTheOperation) {
  const Weight w(128, 64, 5);
  auto dev = gpu::make_emulated_device(uint64_t(64) << 20, kChunk);
  gpu::DeviceLayer& d = *dev;
  auto gpu = gpu::make_emulated_cuda_backend(std::move(dev), make_cpu_backend());
  QuantResult q;
  gpu::inject_fault(d, gpu::EmulatedFault::kLaunch);
  std::string e = error_of([&] { gpu->rtn_lsq(w.m, QuantSpec{4, 32, false}, RtnSearchOptions{}, q); });
  EXPECT_EQ(e.rfind("cuda_emulated: rtn_lsq: an illegal memory access was encountered", 0), 0u) << e;
  // The error has surfaced once: the device works again.
  gpu->rtn(w.m, QuantSpec{4, 32, false}, q);
  // A prefetch's copy fails: the operation that waits for the weight names it.
  gpu::inject_fault(d, gpu::EmulatedFault::kCopy);
  const WeightMatrix k = gpu->upload_weight(w.m);
  ASSERT_TRUE(k.buffer);
  e = error_of([&] { gpu->rtn(k, QuantSpec{4, 32, true}, q); });
  EXPECT_EQ(e.rfind("cuda_emulated: rtn: an illegal memory access was encountered (injected into a copy)", 0), 0u) << e;
  // A copy of the device layer's own, outside any operation, and inside one.
  std::vector<uint8_t> host(10000, 7);
  gpu::DeviceBuffer<uint8_t> b(d, host.size());
  // The second chunk of three fails; the third waits for its staging slot (an event): the sync point.
  gpu::inject_fault(d, gpu::EmulatedFault::kCopy, 2);
  e = error_of([&] { d.to_device(b.get(), host.data(), host.size()); });
  EXPECT_EQ(e, "cuda_emulated: (outside an operation): an illegal memory access was encountered (injected into a copy)");
  gpu::inject_fault(d, gpu::EmulatedFault::kCopy, 3);
  {
    const gpu::OpScope scope(d, "awq_losses");
    e = error_of([&] { d.to_host(host.data(), b.get(), host.size()); });
  }
  EXPECT_EQ(e, "cuda_emulated: awq_losses: an illegal memory access was encountered (injected into a copy)");
}

// The operations' own copies in small chunks: a weight in column panels (a budget of 256 KiB), its panels
// pitched rows of the [K, N] layout and consecutive rows of [N, K], every copy through 4 KiB staging
// buffers (a 1000-byte row of 500 fp16 columns does not divide a chunk): the CPU's codes, scales and
// error, bit for bit.
TEST(DeviceStreams, OperationsThroughSmallStagingBuffersMatchTheCpu) {
  for (int k_axis : {0, 1}) {
    Weight w(320, 500, 7);
    if (k_axis == 1) w.m = WeightMatrix{DType::kFloat16, w.bits.data(), 500, 320, 1};
    auto gpu = gpu::make_emulated_cuda_backend(gpu::make_emulated_device(256u << 10, kChunk), make_cpu_backend());
    for (const bool zp : {false, true}) {
      const QuantSpec spec{4, 32, zp};
      QuantResult g, c;
      gpu->rtn_lsq(w.m, spec, RtnSearchOptions{FitWeight::kMagnitude}, g);
      make_cpu_backend()->rtn_lsq(w.m, spec, RtnSearchOptions{FitWeight::kMagnitude}, c);
      expect_same(g, c);
    }
    const OpTransfers t = op(*gpu, "rtn_lsq");
    EXPECT_EQ(t.h2d_bytes, 2 * w.bytes()) << k_axis;  // in panels, each byte once per call
    EXPECT_EQ(t.staged_bytes, t.h2d_bytes + t.d2h_bytes);
    EXPECT_GE(t.staging_chunks, 2 * ceil_div(w.bytes(), kChunk));
  }
}

// A room (DeviceArena): one allocation handed out in 256-byte-aligned pieces, first fit; pieces given
// back merge with their free neighbours and serve later requests; a request no free range holds fails
// without allocating.
TEST(DeviceArena, PiecesOfOneAllocation) {
  auto dev = gpu::make_emulated_device(1u << 20);
  const uint64_t before = dev->ledger().total.allocations;
  gpu::DeviceArena arena(*dev, 3 * 1024);
  EXPECT_EQ(dev->ledger().total.allocations, before + 1);
  EXPECT_EQ(arena.capacity(), 3072u);
  auto* a = static_cast<uint8_t*>(arena.take(1000));  // 1024 counted
  auto* b = static_cast<uint8_t*>(arena.take(1024));
  auto* c = static_cast<uint8_t*>(arena.take(1024));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(b - a, 1024);
  EXPECT_EQ(c - b, 1024);
  EXPECT_EQ(arena.take(1), nullptr);
  EXPECT_EQ(arena.free_bytes(), 0u);
  arena.give(a, 1000);
  arena.give(b, 1024);  // merges with a's range
  EXPECT_EQ(arena.free_bytes(), 2048u);
  EXPECT_EQ(arena.take(2048), a);  // one range again
  arena.give(c, 1024);
  arena.give(a, 2048);  // merges with c's: the whole block
  EXPECT_EQ(arena.take(3072), a);
  EXPECT_EQ(dev->ledger().total.allocations, before + 1);
  EXPECT_EQ(dev->in_use(), gpu::DeviceLayer::counted(3072));
}

// The emulated device: the CUDA backend's memory, staging ring and copies with the host standing in for
// the GPU. Its streams run each copy at once (a prefetch is done when prefetch() returns), so the
// structure and the ledger's counts are the real device's, and the results the same bytes.
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/device.h"

namespace nibble::kernels::gpu {
namespace {

void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
  if (width == 0) return;
  for (size_t r = 0; r < height; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
}

class EmulatedDevice final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  std::string name() const override { return "cuda_emulated"; }
  std::string describe() const override { return "emulated CUDA device (host memory)"; }
  ~EmulatedDevice() override {
    drain_pool();
    release_staging();
  }
  void on_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) override {
    copy_2d(dst, dpitch, src, spitch, width, height);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize() override { surface(); }

  // The test hook (inject_fault): counts down launches or staged copies.
  void arm(EmulatedFault what, uint64_t nth) { fault_ = what, countdown_ = nth; }

 protected:
  void* raw_allocate(size_t bytes) override { return std::malloc(bytes); }
  void raw_release(void* p) override { std::free(p); }
  uint8_t* staging_allocate(size_t bytes) override {
    auto* p = static_cast<uint8_t*>(std::malloc(bytes));
    if (!p) throw std::bad_alloc();
    return p;
  }
  void staging_release(uint8_t* p) override { std::free(p); }
  // The prefetch lane's waits run on the real device's prefetch thread, whose errors surface when the
  // weight is awaited (compute_after_prefetch): not here.
  void slot_wait(Lane lane, int) override {
    if (lane == kCopyLane) surface();
  }
  void slot_to_device(Lane lane, int slot, void* dst, size_t dpitch, size_t width, size_t rows) override {
    copied();
    copy_2d(dst, dpitch, slot_buffer(lane, slot), width, width, rows);
  }
  void slot_from_device(int slot, const void* src, size_t spitch, size_t width, size_t rows) override {
    copied();
    copy_2d(slot_buffer(kCopyLane, slot), width, src, spitch, width, rows);
  }
  void copy_after_compute() override {}
  void compute_after_copy() override {}
  void start_prefetch(uint64_t, void* dst, const void* src, size_t bytes) override {
    stage_in(kPrefetchLane, dst, bytes, src, bytes, bytes, 1);
  }
  void compute_after_prefetch(uint64_t) override { surface(); }
  void on_launch() override {
    if (countdown_ && fault_ == EmulatedFault::kLaunch && --countdown_ == 0)
      pending_ = "an illegal memory access was encountered (injected into a launch)";
  }

 private:
  void copied() {
    if (countdown_ && fault_ == EmulatedFault::kCopy && --countdown_ == 0)
      pending_ = "an illegal memory access was encountered (injected into a copy)";
  }
  // A sync point: an earlier failure surfaces here, as a GPU's asynchronous errors do.
  void surface() {
    if (pending_.empty()) return;
    const std::string e = std::move(pending_);
    pending_.clear();
    fail(e);
  }

  EmulatedFault fault_ = EmulatedFault::kLaunch;
  uint64_t countdown_ = 0;
  std::string pending_;
};

}  // namespace

std::unique_ptr<DeviceLayer> make_emulated_device(uint64_t budget, size_t staging_chunk) {
  return std::make_unique<EmulatedDevice>(budget, staging_chunk);
}

void inject_fault(DeviceLayer& dev, EmulatedFault what, uint64_t nth) {
  auto* e = dynamic_cast<EmulatedDevice*>(&dev);
  if (!e) throw std::invalid_argument("inject_fault: not an emulated device");
  e->arm(what, nth);
}

}  // namespace nibble::kernels::gpu

// The emulated device: the CUDA backend's memory and copies with the host standing in for the GPU.
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/device.h"

namespace nibble::kernels::gpu {
namespace {

class EmulatedDevice final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  std::string name() const override { return "cuda_emulated"; }
  std::string describe() const override { return "emulated CUDA device (host memory)"; }
  ~EmulatedDevice() override { drain_pool(); }
  void on_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) override {
    copy_2d(dst, dpitch, src, spitch, width, height);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}

 protected:
  void* raw_allocate(size_t bytes) override { return std::malloc(bytes); }
  void raw_release(void* p) override { std::free(p); }
  void raw_to_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void raw_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void raw_to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                        size_t height) override {
    copy_2d(dst, dpitch, src, spitch, width, height);
  }
  void raw_to_host_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t height) override {
    copy_2d(dst, dpitch, src, spitch, width, height);
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
    for (size_t r = 0; r < height; ++r)
      copy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
};

}  // namespace

std::unique_ptr<DeviceLayer> make_emulated_device(uint64_t budget) { return std::make_unique<EmulatedDevice>(budget); }

}  // namespace nibble::kernels::gpu

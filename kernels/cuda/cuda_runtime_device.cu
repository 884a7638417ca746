// The real device layer: the CUDA runtime. GPU builds only; the emulated device is its twin.
#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/device.h"

namespace nibble::kernels::gpu {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

class RuntimeDevice final : public DeviceLayer {
 public:
  using DeviceLayer::DeviceLayer;
  std::string name() const override { return "cuda"; }
  std::string describe() const override { return "cuda: " + cuda::device_name(); }
  ~RuntimeDevice() override { drain_pool(); }
  void on_device_2d(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h) override {
    check(cudaMemcpy2D(d, dp, s, sp, w, h, cudaMemcpyDeviceToDevice), "2-D copy on the device");
  }
  void fill_zero(void* d, size_t n) override { check(cudaMemset(d, 0, n), "memset"); }
  void synchronize() override { check(cudaDeviceSynchronize(), "kernel"); }

 protected:
  void* raw_allocate(size_t n) override {
    void* p = nullptr;
    return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
  }
  void raw_release(void* p) override { cudaFree(p); }
  void raw_to_device(void* d, const void* s, size_t n) override {
    check(cudaMemcpy(d, s, n, cudaMemcpyHostToDevice), "copy to device");
  }
  void raw_to_host(void* d, const void* s, size_t n) override {
    check(cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost), "copy to host");
  }
  void raw_to_device_2d(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h) override {
    check(cudaMemcpy2D(d, dp, s, sp, w, h, cudaMemcpyHostToDevice), "2-D copy to device");
  }
  void raw_to_host_2d(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h) override {
    check(cudaMemcpy2D(d, dp, s, sp, w, h, cudaMemcpyDeviceToHost), "2-D copy to host");
  }
};

}  // namespace

std::unique_ptr<DeviceLayer> make_runtime_device(uint64_t budget) { return std::make_unique<RuntimeDevice>(budget); }

}  // namespace nibble::kernels::gpu

namespace nibble::kernels::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

std::string device_name() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "unknown";
  return prop.name;
}

uint64_t free_memory() {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
  return free_b;
}

}  // namespace nibble::kernels::cuda

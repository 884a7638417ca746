// The CUDA backend on a GPU: the single-source backend built by nvcc, on the CUDA runtime and cuBLAS.
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/cuda_device.h"

namespace nibble::kernels::gpu {
std::unique_ptr<DeviceLayer> make_runtime_device(uint64_t budget);
std::unique_ptr<LinAlg> make_cublas_linalg(DeviceLayer& dev);
}  // namespace nibble::kernels::gpu

namespace nibble::kernels::cuda {

std::unique_ptr<Backend> make_backend(uint64_t budget, std::unique_ptr<Backend> host) {
  auto dev = gpu::make_runtime_device(budget);
  auto la = gpu::make_cublas_linalg(*dev);
  return gpu::NIBBLE_GPU_NS::make(std::move(dev), std::move(la), std::move(host));
}

}  // namespace nibble::kernels::cuda

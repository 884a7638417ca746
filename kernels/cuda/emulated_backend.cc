// The emulated CUDA backend: the single-source backend built by the host compiler, on the emulated
// device and OpenBLAS.
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/cuda_backend.h"

namespace nibble::kernels::gpu {

std::unique_ptr<Backend> make_emulated_cuda_backend(uint64_t budget, std::unique_ptr<Backend> host) {
  return make_emulated_cuda_backend(make_emulated_device(budget), std::move(host));
}

std::unique_ptr<Backend> make_emulated_cuda_backend(std::unique_ptr<DeviceLayer> dev, std::unique_ptr<Backend> host) {
  return NIBBLE_GPU_NS::make(std::move(dev), make_blas_linalg(), std::move(host));
}

}  // namespace nibble::kernels::gpu

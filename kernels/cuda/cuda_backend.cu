// CUDA side of the build. Device discovery only for now: the CUDA kernels (RTN, AWQ search)
// land with issue 6, each tested against its CPU twin; until then --device cuda says so.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"

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

}  // namespace nibble::kernels::cuda

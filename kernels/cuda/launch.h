// How a kernel body runs: one call per index of [0, n), entered in the device's transfer ledger as
// one launch.
//  - nvcc, on the GPU: one thread per index, through a kernel of our own. Thrust's for_each would do
//    the same, but CUB's for_each kernel declares launch bounds that cap a thread at 32 registers on
//    recent architectures, and the heavier bodies (weighted search, pairwise sums) then spill; ours
//    asks only for 256-thread blocks.
//  - g++, for the emulated device: CCCL Thrust on its OMP or CPP system (THRUST_DEVICE_SYSTEM), a loop
//    over the indices on the host's threads. The body is the same source either way.
#pragma once
#include <cstdint>

#include "kernels/cuda/device.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#else
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#endif

namespace nibble::kernels::gpu {

#ifdef __CUDACC__
constexpr int kLaunchThreads = 256;

// minBlocks 1: without it ptxas held the heavier bodies (rtn_lsq's per-block search) to 64 registers
// and spilled; with it they take what they need (rtn_lsq: 90 on sm_89) and none spills.
template <class Body>
__global__ void __launch_bounds__(kLaunchThreads, 1) for_each_index(Body body, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * kLaunchThreads;
  for (int64_t i = int64_t(blockIdx.x) * kLaunchThreads + threadIdx.x; i < n; i += stride) body(i);
}

// On the device layer's compute stream (device.h): asynchronous. A launch that fails to start throws here;
// one that fails while running surfaces at the next sync point, naming the operation then running.
template <class Body>
void launch(DeviceLayer& dev, int64_t n, const Body& body) {
  if (n <= 0) return;
  dev.count_launch();
  const int64_t blocks = (n + kLaunchThreads - 1) / kLaunchThreads;
  for_each_index<<<unsigned(blocks < 65535 * 32 ? blocks : 65535 * 32), kLaunchThreads, 0,
                   static_cast<cudaStream_t>(dev.compute_stream())>>>(body, n);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) dev.fail(std::string("kernel launch: ") + cudaGetErrorString(e));
}
#else
template <class Body>
void launch(DeviceLayer& dev, int64_t n, const Body& body) {
  if (n <= 0) return;
  dev.count_launch();
  thrust::for_each(thrust::device, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), body);
}
#endif

}  // namespace nibble::kernels::gpu

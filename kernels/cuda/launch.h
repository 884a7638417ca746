// How a kernel body runs: one call per index of [0, n), through CCCL Thrust. nvcc builds it for the
// GPU (Thrust's CUDA system: one thread per index); g++ builds the same source for the emulated
// device (THRUST_DEVICE_SYSTEM OMP or CPP: a loop over the indices on the host's threads).
#pragma once
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>

namespace nibble::kernels::gpu {

template <class Body>
void launch(int64_t n, const Body& body) {
  if (n <= 0) return;
  thrust::for_each(thrust::device, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), body);
}

}  // namespace nibble::kernels::gpu

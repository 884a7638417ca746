// Cooperative kernels, single source: a block of Body::kLanes threads shares a Body::Shared struct and
// does its work as Body::kPhases phases separated by barriers. `launch_blocks(dev, n_blocks, body)`
// runs body.phase<P>(block, lane, shared) for every block, phase and lane, entered in the transfer
// ledger as one launch.
//  - nvcc, on the GPU: one CUDA block of kLanes threads per work block (grid-stride when there are
//    more than a grid holds), `__shared__` storage, __syncthreads() after every phase, on the device
//    layer's compute stream.
//  - g++, for the emulated device: the blocks in parallel on Thrust's host system; within a block,
//    every lane runs phase 0, then every lane phase 1, ... (loop fission), the shared struct a local.
// The contract that makes the two the same: a lane's locals do not survive its phase (state that
// another phase needs goes through Shared), a phase reads only what earlier phases wrote to Shared,
// and within a phase lanes write disjoint parts of it. warp_tree_reduce below is the one exchange
// inside a phase.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device.h"
#include "kernels/tree_reduce.h"

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

constexpr int kWarp = 32;

// The tree_reduce of the 32 values vals[w * 32 .. w * 32 + 31] of the caller's warp w (written to
// Shared in an earlier phase), returned to the warp's lane 0 (lane % 32 == 0); other lanes get an
// unspecified value. Every lane of the warp must call it (on the GPU it is a shuffle: the values are
// read back into registers and reduced by __shfl_down_sync at offsets 16, 8, ..., 1, the tree's
// pairing; on the emulated device lane 0 reduces the array with the plain tree).
template <class T, class Op>
NIBBLE_HD inline T warp_tree_reduce(const T* vals, int lane, Op op) {
  const T* w = vals + (lane / kWarp) * kWarp;
#ifdef __CUDA_ARCH__
  T v = w[lane % kWarp];
  for (int s = kWarp / 2; s > 0; s /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, s));
  return v;
#else
  if (lane % kWarp != 0) return w[0];
  T v[kWarp];
  for (int i = 0; i < kWarp; ++i) v[i] = w[i];
  return tree_reduce<kWarp>(v, op);
#endif
}

#ifdef __CUDACC__
template <class Body, int P>
__device__ void run_phases(const Body& body, int64_t block, typename Body::Shared& sh) {
  if constexpr (P < Body::kPhases) {
    body.template phase<P>(block, int(threadIdx.x), sh);
    __syncthreads();  // also orders the last phase's reads before the next block's first writes
    run_phases<Body, P + 1>(body, block, sh);
  }
}

template <class Body>
__global__ void __launch_bounds__(Body::kLanes) block_phases(Body body, int64_t n_blocks) {
  __shared__ typename Body::Shared sh;
  for (int64_t b = blockIdx.x; b < n_blocks; b += gridDim.x) run_phases<Body, 0>(body, b, sh);
}
#else
template <class Body>
struct FissionedBlock {
  Body body;
  template <int P>
  void run(int64_t block, typename Body::Shared& sh) const {
    if constexpr (P < Body::kPhases) {
      for (int lane = 0; lane < Body::kLanes; ++lane) body.template phase<P>(block, lane, sh);
      run<P + 1>(block, sh);
    }
  }
  void operator()(int64_t block) const {
    typename Body::Shared sh;
    run<0>(block, sh);
  }
};
#endif

template <class Body>
void launch_blocks(DeviceLayer& dev, int64_t n_blocks, const Body& body) {
  static_assert(Body::kLanes % kWarp == 0 && Body::kLanes <= 1024, "whole warps, at most 1024 threads");
  static_assert(std::is_trivially_default_constructible<typename Body::Shared>::value, "Shared is __shared__ memory");
  if (n_blocks <= 0) return;
  dev.count_launch();
#ifdef __CUDACC__
  const int64_t grid = n_blocks < (int64_t(1) << 30) ? n_blocks : (int64_t(1) << 30);
  // On the compute stream, ordered with the BLAS calls and the other kernels: on the legacy default
  // stream (no stream named) it ran beside them, unordered, and read products not yet written.
  block_phases<Body><<<unsigned(grid), Body::kLanes, 0, static_cast<cudaStream_t>(dev.compute_stream())>>>(body,
                                                                                                         n_blocks);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) dev.fail(std::string("kernel launch: ") + cudaGetErrorString(e));
#else
  thrust::for_each(thrust::device, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n_blocks),
                   FissionedBlock<Body>{body});
#endif
}

}  // namespace nibble::kernels::gpu

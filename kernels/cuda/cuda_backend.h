// The CUDA backend: kernels::Backend on a device layer (real or emulated) and a linear-algebra
// layer (cuBLAS or OpenBLAS). Only the backend selector (kernels/backend.cc) includes this.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace nibble::kernels::gpu {

// The emulated device: the CUDA backend's own code (built by the host compiler with Thrust's
// OMP/CPP system) with host memory as device memory, within `budget` bytes. `host` runs the
// operations that stay on the host (listed in cuda_backend_impl.h).
std::unique_ptr<Backend> make_emulated_cuda_backend(uint64_t budget, std::unique_ptr<Backend> host);
// The same on a given emulated device (tests: a small staging chunk, an injected fault).
class DeviceLayer;
std::unique_ptr<Backend> make_emulated_cuda_backend(std::unique_ptr<DeviceLayer> dev, std::unique_ptr<Backend> host);

}  // namespace nibble::kernels::gpu

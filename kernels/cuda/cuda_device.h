// What the backend selector may ask of the GPU build without including any CUDA header.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace nibble::kernels::cuda {

// Number of usable CUDA devices (0 when the driver or a device is missing); `why` says why not.
int device_count(std::string* why);
// Name of device 0, for the log.
std::string device_name();
// Free memory of device 0 in bytes (0 when unknown).
uint64_t free_memory();
// The CUDA backend on device 0 within `budget` bytes; `host` runs what stays on the host.
std::unique_ptr<Backend> make_backend(uint64_t budget, std::unique_ptr<Backend> host);

}  // namespace nibble::kernels::cuda

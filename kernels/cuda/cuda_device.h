// What the host may ask of the CUDA build without including any CUDA header.
#pragma once
#include <string>

namespace nibble::kernels::cuda {

// Number of usable CUDA devices (0 when the driver or a device is missing); `why` says why not.
int device_count(std::string* why);
// Name of device 0, for the log.
std::string device_name();

}  // namespace nibble::kernels::cuda

#include "kernels/backend.h"

#include <stdexcept>

#ifdef NIBBLE_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace nibble::kernels {

bool cuda_compiled() {
#ifdef NIBBLE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(Device device, std::string* why) {
  std::string reason;
  if (device == Device::kCpu) {
    if (why) *why = "device cpu (requested)";
    return make_cpu_backend();
  }
#ifdef NIBBLE_WITH_CUDA
  const int n = cuda::device_count(&reason);
  if (n > 0) reason = "found " + cuda::device_name() + ", but the CUDA kernels are not implemented yet";
  else reason = "no usable CUDA device (" + reason + ")";
#else
  reason = "this build has no CUDA backend (configure with -DNIBBLE_CUDA=ON)";
#endif
  if (device == Device::kCuda) throw std::runtime_error("--device cuda: " + reason);
  if (why) *why = "device auto: " + reason + "; using CPU";
  return make_cpu_backend();
}

}  // namespace nibble::kernels

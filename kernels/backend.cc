// The backend selector: the one place that names the implementations this build has.
#include "kernels/backend.h"

#include <stdexcept>

#include "kernels/cpu/cpu_backend.h"
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

std::unique_ptr<Backend> make_backend(const BackendOptions& o, std::string* why) {
  std::string reason;
  if (o.device == Device::kCpu) {
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
  if (o.device == Device::kCuda) throw std::runtime_error("--device cuda: " + reason);
  if (why) *why = "device auto: " + reason + "; using CPU";
  return make_cpu_backend();
}

}  // namespace nibble::kernels

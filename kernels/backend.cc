// The backend selector: the one place that names the implementations this build has.
#include "kernels/backend.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/cpu_backend.h"
#ifdef NIBBLE_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#endif
#ifdef NIBBLE_WITH_CUDA_EMULATED
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#endif

namespace nibble::kernels {
namespace {

std::string mib(uint64_t b) {
  return b < (uint64_t(1) << 20) ? std::to_string(b >> 10) + " KiB" : std::to_string(b >> 20) + " MiB";
}

std::unique_ptr<Backend> make_emulated(const BackendOptions& o, std::string* why) {
#ifdef NIBBLE_WITH_CUDA_EMULATED
  const uint64_t budget = o.device_memory ? o.device_memory : gpu::kEmulatedDefaultBudget;
  if (why) *why = "device cuda_emulated (requested): the CUDA backend on the host, device memory budget " + mib(budget);
  return gpu::make_emulated_cuda_backend(budget, make_cpu_backend());
#else
  (void)o;
  (void)why;
  throw std::runtime_error("--device cuda_emulated: this build has no emulated CUDA backend (CCCL's Thrust headers "
                           "were not found at configure time)");
#endif
}

}  // namespace

std::vector<uint8_t> Backend::pack_onnx_codes(const QuantResult& q, int bits) {
  if (bits == 4 && !q.packed.empty()) return q.packed;
  if (q.codes.empty() && !q.kept.empty())
    throw std::invalid_argument("pack_onnx_codes: the codes stayed on the device (QuantResult::keep)");
  return pack_onnx(q.codes, bits);
}

bool cuda_compiled() {
#ifdef NIBBLE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_emulated_compiled() {
#ifdef NIBBLE_WITH_CUDA_EMULATED
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
  if (o.device == Device::kCudaEmulated) return make_emulated(o, why);
#ifdef NIBBLE_WITH_CUDA
  if (cuda::device_count(&reason) > 0) {
    // Default budget: the free memory less a margin for the CUDA context, cuBLAS and other processes.
    const uint64_t free_b = cuda::free_memory();
    const uint64_t margin = std::max<uint64_t>(uint64_t(512) << 20, free_b / 10);
    const uint64_t budget = o.device_memory ? o.device_memory : (free_b > margin ? free_b - margin : 0);
    if (why)
      *why = std::string("device ") + (o.device == Device::kCuda ? "cuda (requested)" : "auto") + ": " +
             cuda::device_name() + ", device memory budget " + mib(budget);
    return cuda::make_backend(budget, make_cpu_backend());
  }
  reason = "no usable CUDA device (" + reason + ")";
#else
  reason = "this build has no CUDA backend (configure with -DNIBBLE_CUDA=ON)";
#endif
  if (o.device == Device::kCuda) throw std::runtime_error("--device cuda: " + reason);
  if (why) *why = "device auto: " + reason + "; using CPU";
  return make_cpu_backend();
}

}  // namespace nibble::kernels

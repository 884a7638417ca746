// The kernels interface: one Backend per device. The host hands it weights as arrays and gets
// arrays back; only backend.cc knows which implementations exist in this build.
#pragma once
#include <memory>
#include <string>

#include "kernels/quant_types.h"

namespace nibble::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Round-to-nearest quantization of one weight (reference: rtn_quantize_ref).
  virtual void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) = 0;
};

enum class Device { kAuto, kCpu, kCuda };

// Picks the backend for `device`. `why` receives one line saying what was chosen and why
// (e.g. "auto: no CUDA device, using CPU"). Throws std::runtime_error when an explicitly
// requested device cannot be used.
std::unique_ptr<Backend> make_backend(Device device, std::string* why);

std::unique_ptr<Backend> make_cpu_backend();

// Whether this build has the CUDA backend compiled in.
bool cuda_compiled();

}  // namespace nibble::kernels

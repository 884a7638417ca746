// The CPU backend: the reference kernels themselves (multi-threaded through parallel_for).
#include "kernels/backend.h"
#include "kernels/cpu/rtn_ref.h"

namespace nibble::kernels {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) override {
    rtn_quantize_ref(w, spec, out);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace nibble::kernels

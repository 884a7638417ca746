// The CPU backend: the fast CPU kernels, each tested bit for bit against its reference.
#include "kernels/backend.h"
#include "kernels/cpu/rtn_fast.h"

namespace nibble::kernels {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) override {
    rtn_quantize_fast(w, spec, out);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace nibble::kernels

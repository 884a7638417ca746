// A method's quantizer made from the calibration's statistics (GPTQ, the clip searches, and any new kind):
// the search stage makes one (search_calibrated in host/run/stages.cc) and emit asks it for every weight
// it quantizes. A new kind derives from this class: neither the stage's types nor emit change.
#pragma once
#include <vector>

#include "host/graph/plan.h"
#include "kernels/quant_types.h"

namespace nibble {

// A weight as emit will hand it to quantize(): prepared (W ⊙ s, its columns divided where a consumer's 1/s
// is folded in), with its spec, its AWQ scale and that divisor (either may be null).
struct GroupWeight {
  const PlannedWeight* pw = nullptr;
  kernels::WeightMatrix w;
  kernels::QuantSpec spec;
  const std::vector<float>* awq_scale = nullptr;
  const std::vector<float>* divisor = nullptr;
};

class CalibratedQuantizer {
 public:
  virtual ~CalibratedQuantizer() = default;
  // Whether it quantizes the plan's weights together: emit then calls begin_group with all of them, before
  // the first quantize().
  virtual bool wants_group() const { return false; }
  virtual void begin_group(const std::vector<GroupWeight>& /*weights*/) {}
  // Quantizes the weight the pipeline prepared (W, or W ⊙ s where the method searched AWQ scales;
  // awq_scale: that s, or null) into q.
  virtual void quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                        const std::vector<float>* awq_scale, kernels::QuantResult& q) = 0;
};

}  // namespace nibble

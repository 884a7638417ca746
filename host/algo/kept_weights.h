// Weights a device backend keeps between the stages of one run (the AWQ search, the sensitivity
// measure, the quantizer), so that each weight crosses the bus once: the first stage that reads a
// weight keeps it (Backend::keep), later stages read that copy, and the quantizer takes it, after
// which the device memory is freed as its last handle goes. On the CPU, keep() hands back the host
// view and nothing is held.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "host/graph/plan.h"
#include "kernels/backend.h"

namespace nibble {

class KeptWeights {
 public:
  // The weight of `pw` (host bytes at `data`) as the backend holds it; kept on the first call.
  kernels::WeightMatrix get(kernels::Backend& backend, const PlannedWeight& pw, const void* data);
  // The weight of `pw` with its kept copy when there is one (else the host view), forgotten here.
  kernels::WeightMatrix take(const PlannedWeight& pw, const void* data);
  size_t size() const { return kept_.size(); }

 private:
  std::map<std::string, std::shared_ptr<const kernels::Resident>> kept_;
};

// `kept`'s copy of the weight when a holder is given, else one kept for the caller alone.
kernels::WeightMatrix keep_weight(kernels::Backend& backend, KeptWeights* kept, const PlannedWeight& pw,
                                  const void* data);

}  // namespace nibble

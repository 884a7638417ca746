// Weights a device backend keeps between the stages of one run (the AWQ search, the sensitivity
// measure, the quantizer), so that each weight crosses the bus once: the first stage that reads a
// weight uploads it (Backend::upload), later stages read that copy, and the quantizer takes it, after
// which the device memory is freed as its last handle goes. On the CPU, upload() hands back the host
// view and nothing is held. What is held for the quantizer stays within a quarter of the device budget,
// so that the weights searched later can still be kept for their own search (beyond it, a weight is kept
// for its caller alone and goes up again for the quantizer). Held weights share one device allocation (a room
// reserved for them when the search starts, Backend::reserve), so that holding more of them allocates no
// more.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "host/graph/plan.h"
#include "kernels/backend.h"

namespace nibble {

class KeptWeights {
 public:
  // Reserves the room for the weights a search will hold, given in the order it keeps them (the sibling
  // groups'): their sizes while they fit the quarter of the budget. Nothing where the backend keeps nothing.
  void reserve(kernels::Backend& backend, const Plan& plan);
  // The weight of `pw` (host bytes at `data`) as the backend holds it; kept on the first call, and held
  // here when it fits.
  kernels::WeightMatrix get(kernels::Backend& backend, const PlannedWeight& pw, const void* data);
  // The weight of `pw` with its kept copy when there is one (else the host view), forgotten here.
  kernels::WeightMatrix take(const PlannedWeight& pw, const void* data);
  // Holds `copy` (the backend's copy of the weight's bytes as stored, e.g. the layer engine's upload) for
  // `pw` when its size is the weight's; true when held.
  bool adopt(const PlannedWeight& pw, const kernels::Tensor& copy);
  // The held copy of `pw` as a tensor of its bytes as stored (empty when none is held).
  kernels::Tensor held_tensor(const PlannedWeight& pw) const;
  size_t size() const { return kept_.size(); }
  // Whether a copy of this weight is held (the quantizer then reads it; nothing prefetches it again).
  bool holds(const std::string& weight) const { return kept_.count(weight) > 0; }

 private:
  struct Held {
    std::shared_ptr<const kernels::Buffer> copy;
    uint64_t bytes = 0;
  };
  std::map<std::string, Held> kept_;
  uint64_t held_bytes_ = 0;
  std::shared_ptr<kernels::Buffer> room_;  // where held weights go (null: each its own allocation)
};

// `kept`'s copy of the weight when a holder is given, else one kept for the caller alone.
kernels::WeightMatrix keep_weight(kernels::Backend& backend, KeptWeights* kept, const PlannedWeight& pw,
                                  const void* data);

}  // namespace nibble

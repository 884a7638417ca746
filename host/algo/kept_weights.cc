#include "host/algo/kept_weights.h"

namespace nibble {
namespace {

kernels::WeightMatrix view_of(const PlannedWeight& pw, const void* data) {
  return kernels::WeightMatrix{pw.dtype, data, pw.rows, pw.cols, pw.k_axis, {}};
}

}  // namespace

kernels::WeightMatrix KeptWeights::get(kernels::Backend& backend, const PlannedWeight& pw, const void* data) {
  kernels::WeightMatrix w = view_of(pw, data);
  const auto it = kept_.find(pw.weight);
  if (it != kept_.end()) {
    w.resident = it->second.copy;
    return w;
  }
  w = backend.keep(w);
  const uint64_t bytes = uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype);
  // A backend that did not keep it is asked again next time.
  if (w.resident && held_bytes_ + bytes <= backend.device_memory().budget / 4) {
    kept_[pw.weight] = Held{w.resident, bytes};
    held_bytes_ += bytes;
  }
  return w;
}

kernels::WeightMatrix KeptWeights::take(const PlannedWeight& pw, const void* data) {
  kernels::WeightMatrix w = view_of(pw, data);
  const auto it = kept_.find(pw.weight);
  if (it == kept_.end()) return w;
  w.resident = std::move(it->second.copy);
  held_bytes_ -= it->second.bytes;
  kept_.erase(it);
  return w;
}

kernels::WeightMatrix keep_weight(kernels::Backend& backend, KeptWeights* kept, const PlannedWeight& pw,
                                  const void* data) {
  return kept ? kept->get(backend, pw, data) : backend.keep(view_of(pw, data));
}

}  // namespace nibble

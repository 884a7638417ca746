#include "host/algo/kept_weights.h"

namespace nibble {
namespace {

kernels::WeightMatrix view_of(const PlannedWeight& pw, const void* data) {
  return kernels::WeightMatrix{pw.dtype, data, pw.rows, pw.cols, pw.k_axis, {}};
}

uint64_t bytes_of(const PlannedWeight& pw) { return uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype); }

}  // namespace

void KeptWeights::reserve(kernels::Backend& backend, const Plan& plan) {
  const uint64_t quarter = backend.device_memory().budget / 4;
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const auto& [act, idx] : plan.siblings)
    for (size_t i : idx) {
      const uint64_t b = bytes_of(plan.weights[i]);
      if (total + b > quarter) continue;  // as get() would not hold it
      sizes.push_back(b);
      total += b;
    }
  room_.reset();  // a room reserved before goes first
  room_ = backend.reserve(sizes);
}

kernels::WeightMatrix KeptWeights::get(kernels::Backend& backend, const PlannedWeight& pw, const void* data) {
  kernels::WeightMatrix w = view_of(pw, data);
  const auto it = kept_.find(pw.weight);
  if (it != kept_.end()) {
    w.buffer = it->second.copy;
    return w;
  }
  const uint64_t bytes = bytes_of(pw);
  if (room_) {  // held where it fits the room, else kept for the caller alone
    kernels::WeightMatrix in = kernels::WeightMatrix::of(backend.upload_into(w.tensor(), room_), w.k_axis);
    if (in.buffer) {
      kept_[pw.weight] = Held{in.buffer, bytes};
      held_bytes_ += bytes;
      return in;
    }
    return backend.upload_weight(w);
  }
  w = backend.upload_weight(w);
  // A backend that did not keep it is asked again next time.
  if (w.buffer && held_bytes_ + bytes <= backend.device_memory().budget / 4) {
    kept_[pw.weight] = Held{w.buffer, bytes};
    held_bytes_ += bytes;
  }
  return w;
}

kernels::Tensor KeptWeights::held_tensor(const PlannedWeight& pw) const {
  const auto it = kept_.find(pw.weight);
  if (it == kept_.end()) return {};
  return kernels::Tensor{pw.dtype, {pw.rows, pw.cols}, nullptr, it->second.copy};
}

bool KeptWeights::adopt(const PlannedWeight& pw, const kernels::Tensor& copy) {
  const uint64_t bytes = bytes_of(pw);
  if (!copy.buffer || copy.dtype != pw.dtype || copy.bytes() != bytes || kept_.count(pw.weight)) return false;
  kept_[pw.weight] = Held{copy.buffer, bytes};
  held_bytes_ += bytes;
  return true;
}

kernels::WeightMatrix KeptWeights::take(const PlannedWeight& pw, const void* data) {
  kernels::WeightMatrix w = view_of(pw, data);
  const auto it = kept_.find(pw.weight);
  if (it == kept_.end()) return w;
  w.buffer = std::move(it->second.copy);
  held_bytes_ -= it->second.bytes;
  kept_.erase(it);
  if (kept_.empty()) room_.reset();  // freed with the last piece: the quantizers' panels get its memory
  return w;
}

kernels::WeightMatrix keep_weight(kernels::Backend& backend, KeptWeights* kept, const PlannedWeight& pw,
                                  const void* data) {
  return kept ? kept->get(backend, pw, data) : backend.upload_weight(view_of(pw, data));
}

}  // namespace nibble

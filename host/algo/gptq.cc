#include "host/algo/gptq.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "host/algo/awq.h"
#include "host/algo/learned_rounding.h"
#include "host/methods.h"
#include "loaders/error.h"

namespace nibble {

GptqQuantizer::GptqQuantizer(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend,
                             bool learned_rounding)
    : learned_(learned_rounding), learned_opt_(learned_rounding_options(o)), o_(o), calib_(calib),
      backend_(backend) {
  opt_.ratios = block_clip_ratios();
  opt_.both_signs = true;
}

void GptqQuantizer::quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                             const std::vector<float>* awq_scale, kernels::QuantResult& q) {
  const std::vector<float> scale = awq_scale ? *awq_scale : std::vector<float>{};
  if (pw.activation != activation_ || scale != scale_ || factor_.K != pw.K()) {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t block = 0;
    // Where calibration keeps it: the layer engine's on the backend is read there.
    const kernels::Tensor gram = calib_.gram_tensor(pw.activation, pw.K(), &block);
    if (block) throw Error("GPTQ needs the whole XᵀX of '" + pw.activation + "'; calibration kept only its blocks");
    std::vector<float> inv(scale.size());
    for (size_t k = 0; k < inv.size(); ++k) inv[k] = 1.0f / scale[k];
    factor_ = kernels::GptqFactor{};  // the last activation's U (on a device: its memory) is no longer needed
    try {
      factor_ = backend_.gptq_factor(gram, awq_scale ? inv.data() : nullptr, o_.gptq_percdamp, o_.gptq_act_order);
    } catch (const std::runtime_error& e) {
      throw Error("'" + pw.activation + "': " + e.what());
    }
    if (learned_ && !activation_.empty() && activation_ != pw.activation) calib_.release_gram(activation_);
    if (!learned_) calib_.release_gram(pw.activation);
    // Learned rounding reads XᵀX where calibration keeps it (the layer engine's on a device: read there).
    gram_ = learned_ ? gram : kernels::Tensor{};
    inv_ = awq_scale ? inv : std::vector<float>{};
    activation_ = pw.activation;
    scale_ = scale;
    spdlog::debug("gptq: factor of {} (K = {}), dampening {:.4g}, {:.3f} s", pw.activation, pw.K(), factor_.damp,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (learned_) q.keep = false;  // its codes come back to be learned
  backend_.gptq_quantize(w, spec, factor_, opt_, q);
  if (learned_) learn_rounding(backend_, w, spec, gram_, inv_.empty() ? nullptr : inv_.data(), learned_opt_, q);
}

}  // namespace nibble

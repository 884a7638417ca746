// GPTQ (Frantar et al. 2022) on the Gram matrix XᵀX that calibration keeps anyway: no token rows, and
// one forward pass per window for all layers (per group of kGptqCalibrationBudgetMb below). Per activation, the inverse-Hessian factor of H = XᵀX (+ --gptq_percdamp of
// its mean diagonal) is computed once and shared by every weight reading that activation; each weight
// is then swept channel by channel (backend gptq_quantize). awq_gptq runs on W ⊙ s against X ⊘ s:
// H scaled by 1/s on both sides. Each block's scale is chosen, when the sweep reaches the block, among
// clip ratios of both signs by the error weighted with diag(H) (the activation energy of each channel).
#pragma once
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "host/algo/calibrated_quantizer.h"
#include "host/graph/plan.h"
#include "host/options.h"
#include "kernels/backend.h"

namespace nibble {

// Calibration memory per pass for GPTQ (MiB): its state is nothing but the Gram matrices, which next to
// ONNX Runtime's copy of the weights are the calibration child's peak (SmolLM2-135M: 403 MiB of them
// against 440 MiB of weights); in groups of at most this much, one forward pass each, the peak drops by
// most of them for a few more forward passes (cheap next to the GPTQ sweep).
constexpr int64_t kGptqCalibrationBudgetMb = 256;

class GptqQuantizer : public CalibratedQuantizer {
 public:
  // learned_rounding: each weight's codes are then refined by awq_learned's sweeps (host/algo/learned_rounding.h).
  GptqQuantizer(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend, bool learned_rounding);

  // Quantizes the weight the pipeline prepared (W, or W ⊙ s for awq_gptq; awq_scale: that s) into q;
  // for awq_learned, its rounding is then learned (host/algo/learned_rounding.h).
  void quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                const std::vector<float>* awq_scale, kernels::QuantResult& q) override;

 private:
  // awq_learned: the Gram matrix of the current activation stays until the next one's (each weight's
  // learned rounding reads it), then goes.
  bool learned_;
  kernels::LearnedRoundingOptions learned_opt_;
  kernels::Tensor gram_;  // learned rounding's XᵀX, where calibration keeps it
  std::vector<float> inv_;
  const QuantizeOptions& o_;
  Calibration& calib_;
  kernels::Backend& backend_;
  kernels::GptqOptions opt_;
  // The factor of the last activation (and scale) asked for: siblings come one after the other.
  std::string activation_;
  std::vector<float> scale_;
  kernels::GptqFactor factor_;
};

}  // namespace nibble

// AWQ clip and AWQ full (the awq_lite scale search, then the clip search), nibble's: no token rows: the
// Gram matrix G = XᵀX of the one calibration pass (all tokens) gives each block's loss d_bᵀ G_bb d_b;
// awq_full searches what is really quantized (W ⊙ s against X ⊘ s: G scaled by 1/s on both sides).
// Ratio grid from --awqclip_alpha_step/_min, with both signs of the symmetric scale; --use_zero_point
// honoured (clip of [min, max]). ModelOpt's clip search is modelopt::TokenSampleClipSearch
// (host/algo/modelopt_compat.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "host/algo/awq.h"
#include "host/algo/calibrated_quantizer.h"
#include "calib/calibration.h"
#include "host/options.h"
#include "host/graph/plan.h"
#include "kernels/quant_types.h"
#include "loaders/onnx_model.h"

namespace nibble {

// The clip ratio grid, ModelOpt's: [round(r, 2) for r in np.arange(alpha_min, 1.0, step)] + [1.0].
std::vector<double> clip_ratio_grid(double step, double alpha_min);

// What calibration must keep for nibble's clip search: only the block-diagonal of XᵀX where that is
// all its loss reads (~K·B instead of K² per activation).
Calibration::Extras clip_calibration(const QuantizeOptions& o, const Plan& plan);

// A clip search: quantizes each weight with the clip ratios it searched (make_clip_search picks one).
class ClipSearch : public CalibratedQuantizer {};

// nibble's: each weight searched on the Gram matrix while it is quantized.
class GramClipSearch : public ClipSearch {
 public:
  GramClipSearch(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend);

  // With awq_scale, G is scaled by 1/s on both sides (the loss of W ⊙ s against X ⊘ s).
  void quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                const std::vector<float>* awq_scale, kernels::QuantResult& q) override;

 private:
  const QuantizeOptions& o_;
  Calibration& calib_;
  kernels::Backend& backend_;
  // The Gram blocks of the activation last read, kept on a device backend for its sibling weights.
  std::string blocks_of_;
  kernels::Tensor blocks_;
};

}  // namespace nibble

// AWQ clip and AWQ full (the awq_lite scale search, then the clip search).
//   modelopt  ModelOpt 0.47: every weight's ratios searched on ModelOpt's token sample (rows 0, step,
//             2·step, ... of the concatenated calibration activations, step = T // 64, padding
//             included), float32 per-block partial products, first strictly smaller loss; the final
//             weight quantized symmetric with those ratios (awq_clip ignores --use_zero_point, awq_full
//             with a zero point computes ratios that have no effect). awq_full searches on W ⊙ s* of
//             the node's own search against the UNSCALED X, and quantizes W ⊙ s (siblings' mean).
//   nibble    no token rows: the Gram matrix G = XᵀX of the one calibration pass (all tokens) gives
//             each block's loss d_bᵀ G_bb d_b; awq_full searches what is really quantized (W ⊙ s against
//             X ⊘ s: G scaled by 1/s on both sides). Ratio grid from --awqclip_alpha_step/_min, with
//             both signs of the symmetric scale; --use_zero_point honoured (clip of [min, max]).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "host/algo/awq.h"
#include "calib/calibration.h"
#include "host/options.h"
#include "host/graph/plan.h"
#include "kernels/quant_types.h"
#include "loaders/onnx_model.h"

namespace nibble {

// ModelOpt's max_tokens (int4.py _clip_search): the token sample modelopt mode asks calibration for.
constexpr int64_t kClipMaxTokens = 64;

// ModelOpt's grid: [round(r, 2) for r in np.arange(alpha_min, 1.0, step)] + [1.0].
std::vector<double> modelopt_clip_ratios(double step, double alpha_min);

// What calibration must keep for the clip search: modelopt mode ModelOpt's token sample; nibble-mode
// awq_clip only the block-diagonal of XᵀX (what its loss reads: ~K·B instead of K² per activation).
Calibration::Extras clip_calibration(const QuantizeOptions& o, const Plan& plan);

// awq_full in modelopt mode: each node's own scale s* (per_node) and the final scales (siblings'
// mean with fuse on, as awq_lite_search gives them).
void awq_full_modelopt_scales(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                              kernels::Backend& backend, std::map<std::string, AwqChoice>* per_node,
                              std::map<std::string, AwqChoice>* final_scales);

class ClipSearch {
 public:
  ClipSearch(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend);

  // modelopt mode: searches every weight of the plan now (on W ⊙ s* with per_node, else on W).
  void search_modelopt(OnnxModel& model, const Plan& plan, const std::map<std::string, AwqChoice>* per_node);

  // Quantizes the weight the pipeline prepared (W, or W ⊙ s for awq_full) into q. awq_scale: the
  // s that W was multiplied by (nibble mode scales G by 1/s), or null.
  void quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                const std::vector<float>* awq_scale, kernels::QuantResult& q);

 private:
  const QuantizeOptions& o_;
  Calibration& calib_;
  kernels::Backend& backend_;
  bool modelopt_;
  std::map<std::string, std::vector<float>> ratios_;
  // nibble: the Gram blocks of the activation last read, kept on a device backend for its sibling weights.
  std::string blocks_of_;
  std::shared_ptr<const kernels::Resident> kept_blocks_;
};

}  // namespace nibble

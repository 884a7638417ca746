// AWQ-lite: for every planned weight, the per-input-channel scale s that
// minimises the output error of quantizing W ⊙ s (with X ⊘ s on the activation side), chosen on
// a grid of alphas from calibration statistics. Two modes:
//   modelopt  ModelOpt 0.47's arithmetic and quirks (strided weight statistic, fixed 11-point grid,
//             padding tokens counted, per-node search, sibling scales averaged), for bit-exact codes;
//   nibble    contiguous blocks, --awqlite_alpha_step honoured, padding masked, one joint search
//             per group of siblings (they share an input, so they share s).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "host/options.h"
#include "host/algo/kept_weights.h"
#include "host/graph/plan.h"
#include "kernels/backend.h"
#include "loaders/onnx_model.h"

namespace nibble {

struct AwqChoice {
  std::vector<float> scale;      // final s, K values (after sibling averaging)
  double alpha = 0;              // alpha of this weight's own search (or its group's)
  std::vector<double> losses;    // loss per alpha of that search
};

// ModelOpt with fuse on: siblings (MatMuls sharing an input) all get the mean of their scales.
void average_sibling_scales_modelopt(const Plan& plan, kernels::Backend& backend,
                                     std::map<std::string, AwqChoice>* choices);

// Searches every weight of the plan, in ModelOpt's arithmetic or nibble's. nibble's search leaves the
// weights it read in `kept` (when given) for the quantizer.
std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& options, bool modelopt,
                                                 kernels::Backend& backend, KeptWeights* kept = nullptr);

// Clip ratios a block may choose from in nibble mode (with either sign of the scale).
const std::vector<float>& block_clip_ratios();

// The alpha grid: ModelOpt's per-node grid is fixed at 0.0, 0.1, ..., 1.0 (np.arange values).
std::vector<double> awq_alphas(double step);

}  // namespace nibble


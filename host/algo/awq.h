// AWQ-lite, nibble's: for every planned weight, the per-input-channel scale s that minimises the
// output error of quantizing W ⊙ s (with X ⊘ s on the activation side), chosen on a grid of alphas
// from calibration statistics: contiguous blocks, --awqlite_alpha_step honoured, padding masked, one
// joint search per group of siblings (they share an input, so they share s). ModelOpt's search is
// modelopt::awq_lite_search (host/algo/modelopt_compat.h).
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

// Searches every weight of the plan in nibble's arithmetic; leaves the weights it read in `kept` (when
// given) for the quantizer.
std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& options, kernels::Backend& backend,
                                                 KeptWeights* kept = nullptr);

// Clip ratios a block may choose from in nibble mode (with either sign of the scale).
const std::vector<float>& block_clip_ratios();

// np.arange(start, stop, step)'s values, ModelOpt's grids: ceil((stop - start) / step) values
// start + i·step, each computed from i (not accumulated), as numpy does; none when step <= 0.
std::vector<double> numpy_arange(double start, double stop, double step);

// The alpha grid 0, step, 2·step, ..., 1: np.arange(0, 1 + step, step), as ModelOpt builds it.
std::vector<double> awq_alphas(double step);

}  // namespace nibble


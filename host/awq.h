// AWQ-lite (reference spec §5): for every planned weight, the per-input-channel scale s that
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

#include "host/calibration.h"
#include "host/options.h"
#include "host/plan.h"
#include "loaders/onnx_model.h"

namespace nibble {

struct AwqChoice {
  std::vector<float> scale;      // final s, K values (after sibling averaging)
  double alpha = 0;              // alpha of this weight's own search (or its group's)
  std::vector<double> losses;    // loss per alpha of that search
};

// ModelOpt with fuse on: siblings (MatMuls sharing an input) all get the mean of their scales.
void average_sibling_scales_modelopt(const Plan& plan, std::map<std::string, AwqChoice>* choices);

// Searches every weight of the plan. `progress` is called once per weight searched.
std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& options, bool modelopt);

// Clip ratios a block may choose from in nibble mode (with either sign of the scale).
const std::vector<float>& block_clip_ratios();

// The alpha grid: ModelOpt's per-node grid is fixed at 0.0, 0.1, ..., 1.0 (np.arange values).
std::vector<double> awq_alphas(double step);

}  // namespace nibble

namespace nibble {
class GraphRewriter;

// Puts 1/s on the activation side of every searched weight: folded into the producer where that is
// exact — (Skip)SimplifiedLayerNormalization and LayerNormalization scale (and LayerNormalization
// bias; never a Skip bias, which is added before the norm), a Mul by a constant, a MatMul/Gemm
// producer's weight columns — and otherwise a Mul node (one per group of siblings, or one per
// weight with --awqlite_disable_fuse_nodes or when the activation is a graph input). Returns, for
// planned weights that are themselves producers, the column divisors to apply BEFORE they are
// quantized (ModelOpt folds after, and loses the 1/s).
std::map<std::string, std::vector<float>> place_awq_scales(OnnxModel& model, const Plan& plan,
                                                           const std::map<std::string, AwqChoice>& choices,
                                                           GraphRewriter& rewriter, bool fuse);

}  // namespace nibble

// Where the AWQ input scales go: 1/s on the activation side of every searched weight.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "host/graph/plan.h"
#include "host/graph/rewrite.h"
#include "loaders/onnx_model.h"

namespace nibble {

// Puts 1/s on the activation side of every weight in `scales` (weight name -> s, K values): folded
// into the producer where that is exact — (Skip)SimplifiedLayerNormalization and LayerNormalization
// scale (and LayerNormalization bias; never a Skip bias, which is added before the norm), a Mul by a
// constant, a MatMul/Gemm producer's weight columns — and otherwise a Mul node (one per group of
// siblings, or one per weight with fuse off or when the activation is a graph input). Returns, for
// planned weights that are themselves producers, the column divisors to apply BEFORE they are
// quantized (ModelOpt folds after, and loses the 1/s). Divisions of constants run on `backend`.
std::map<std::string, std::vector<float>> place_awq_scales(OnnxModel& model, const Plan& plan,
                                                           const std::map<std::string, std::vector<float>>& scales,
                                                           GraphRewriter& rewriter, kernels::Backend& backend,
                                                           bool fuse);

}  // namespace nibble

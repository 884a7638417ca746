// Rounding learned on each decoder layer's whole output (AutoRound's method, Cheng et al. 2023, on nibble's
// layer engine): for one layer group at a time, every weight's rounding offsets and block-scale factors
// (kernels/layer_rounding.h) move by sign steps against the gradient of the layer's output error on the
// calibration tokens, the gradient coming from the engine's reverse pass (forward/backward.h).
//
// The layer's segment runs from its first MatMul to the node after its last; its output is what the nodes
// after the segment read of the values computed inside it (the residual stream). The objective is the mean
// squared difference of that output from the float model's on the same calibration batch (the float
// layer on the float model's activations), each token's row weighed down where the target's row is larger
// than the median row (weigh_tokens). Its input: the outputs of the layers already learned (AutoRound's
// way, a second stream of activations; on the float model's activations instead it closed 31% of awq_gptq's
// gap to the float model on SmolLM2 fp32 against 43%). Where a residual sum joins two output values (the next node an Add or a
// skip norm reading both), the error is that of their sum.
//
// The learner has its own engine over the model and runs the calibration batches itself (host float32).
// Deterministic for a fixed thread count: the batches' order comes from a seeded generator.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "forward/graph_run.h"
#include "kernels/backend.h"
#include "kernels/quant_types.h"
#include "loaders/onnx_model.h"

namespace nibble {

struct LayerLearningOptions {
  int iters = 50;            // sign steps per layer
  double lr = 0;             // the first step, in levels (0: 1 / iters, AutoRound's default); falls linearly to 0
  // Calibration samples per step (0: the batches as the engine joins them, up to 1024 tokens).
  int samples = 1;
  // Each token row's squared error weighed down to the median row's size where the float target is larger
  // (objective in layer_learning.cc); false: the plain mean.
  bool weigh_tokens = true;
  bool quiet = false;
};

// One of the group's weights, in and out.
struct LearnedWeight {
  std::string name;  // the initializer
  DType dtype = DType::kFloat32;  // the graph's weight type (what the substitute is rounded to)
  int64_t rows = 0, cols = 0;
  int k_axis = 0;
  std::vector<float> w;  // W' = W ⊙ s (/ d) in float32, laid out as the weight
  // The unrounded values the offsets move, laid out as w; empty: w itself. A start whose codes are not w's
  // nearest levels (GPTQ's) gives values that round to its codes (rounding_base_for_codes).
  std::vector<float> base;
  std::vector<float> s, divisor;  // AWQ's s (K) and a consumer's divisor (N); empty where none
  kernels::QuantSpec spec;
  int scale_dtype = 0;  // kernels::hd's type code of the scales
  kernels::QuantResult q;  // in: the starting codes, scales, zero points; out: the learned ones
};

// Fills w.base from w.w and the start w.q: values whose nearest levels are q's codes (at zero offsets and
// factors), each as near its weight as that allows. Returns how many elements could not be made to round to
// their code (none but a block of scale 0).
int64_t set_rounding_base(LearnedWeight& w);

// Each row's weight in the objective, for a target of n values in rows of `row`: 1, or with `weigh` the
// median row's mean square over the row's own where that is larger.
std::vector<float> token_row_weights(const float* target, size_t n, size_t row, bool weigh);

struct LayerLearningStats {
  // Over up to 16 of the steps' batches, spread evenly (all of them where there are no more).
  double objective_start = 0, objective_end = 0;
  int64_t codes_moved = 0, weights = 0;
  bool kept_start = false;  // the learned weights did no better there than the start: not used
  double seconds = 0;
};

class LayerLearner {
 public:
  // feeds: the calibration batches' model inputs (EngineCalibration::batch_feeds). The offsets and scale
  // factors live on `backend` and move there (layer_round_weight, layer_round_step); the forward and the
  // reverse pass run on the host.
  LayerLearner(const std::string& model_path, std::vector<std::map<std::string, forward::Value>> feeds,
               kernels::Backend& backend, LayerLearningOptions o);
  ~LayerLearner();

  // Why the group of these initializers cannot be learned here (an operator without a reverse pass, a weight
  // no MatMul reads), or empty.
  std::string cannot_learn(const std::vector<std::string>& weights);
  // Learns the group's weights (each q in and out) and moves the batches past the group. Groups come in
  // graph order.
  LayerLearningStats learn(std::vector<LearnedWeight>& weights);

 private:
  struct Segment {
    size_t first = 0, end = 0;
  };
  Segment segment_of(const std::vector<std::string>& weights) const;
  std::unique_ptr<OnnxModel> model_;
  std::unique_ptr<forward::GraphRun> graph_;
  // Every calibration step's sample: the float model's activations, and the learned layers' outputs (the
  // next layer's inputs), each where the groups before left it.
  std::vector<forward::GraphRun::State> float_, learned_;
  kernels::Backend& backend_;
  LayerLearningOptions o_;
  int groups_done_ = 0;
};

}  // namespace nibble

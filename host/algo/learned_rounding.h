// awq_learned: awq_gptq's codes, then each weight's rounding learned on the layer's output error through
// the same XᵀX (backend learned_rounding, kernels/learned_rounding.h): greedy sweeps that move single
// levels wherever the objective falls, each weight kept to the levels around its value and GPTQ's; with
// --learned_iters, AutoRound's sign steps on a rounding offset per weight first. GPTQ minimises that
// objective one channel at a time, compensating only the channels after it; the sweeps revisit every
// channel with all the others fixed, so the result is never worse than GPTQ's on it. Scales and zero
// points stay GPTQ's. Measured (SmolLM2-135M, and a generated model): the sign steps lower the objective
// by at most 0.1% more than the sweeps alone, at 10-20x their time, so the default takes none.
#pragma once
#include <cstdint>

#include "host/options.h"
#include "kernels/backend.h"

namespace nibble {

// What the run's learned rounding did, over every weight (the report's summary.learned_rounding).
struct LearnedRoundingTotals {
  double objective_gptq = 0;
  double objective_learned = 0;
  int64_t codes_moved = 0;
  int64_t weights = 0;
  double seconds = 0;
};

kernels::LearnedRoundingOptions learned_rounding_options(const QuantizeOptions& o);

// Learns q's rounding (gptq_quantize's result for w, which is W ⊙ s when inv_s is given) and adds to the
// run's totals.
void learn_rounding(kernels::Backend& backend, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                    const kernels::Tensor& gram, const float* inv_s, const kernels::LearnedRoundingOptions& opt,
                    kernels::QuantResult& q);

LearnedRoundingTotals learned_rounding_totals();

}  // namespace nibble

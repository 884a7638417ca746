// layer_round_weight and layer_round_step on the host (kernels/layer_rounding.h's element math): the
// reference walks block columns one after another (`*_ref`); the fast version sweeps tiles of columns on
// the threads, rows in order within a tile (a [K, N] weight's rows are contiguous, and there the row's
// element math runs over arrays the compiler vectorizes), the same bits.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

Tensor layer_round_weight_ref(const LayerRoundProblem& p, const LayerRoundParams& x);
LayerRoundParams layer_round_step_ref(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g,
                                      float size);
Tensor layer_round_weight_fast(const LayerRoundProblem& p, const LayerRoundParams& x);
LayerRoundParams layer_round_step_fast(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor& g,
                                       float size);

}  // namespace nibble::kernels

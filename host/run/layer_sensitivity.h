// Layer by layer with --mixed_strategy sensitivity: the INT8 set is chosen before any layer is quantized.
// A first sweep calibrates each layer alone (the float layers fed forward: nothing is quantized yet, and
// the whole-model pass measures on float activations too), runs the 4-bit AWQ search the measure needs,
// records each weight's output error at 4 and at 8 bits and drops the statistics. Then the greedy pick of
// the whole-model pass runs once on every weight's errors, so the choice is the same. The errors of each
// layer (sensitivity_<g>.json) and the pick (mixed.json) are written atomically to the state folder: a
// resumed run measures no finished layer again and makes the same choice. Cost: one more calibration
// pass per layer.
#pragma once
#include <string>
#include <vector>

#include "host/run/stages.h"

namespace nibble {

// The first sweep and the pick (or the pick of a stopped run, on --resume): sets 8 bits on the chosen
// weights of planned.plan and fills planned.mixed (picked = true).
void choose_int8_layer_by_layer(const QuantizeOptions& o, OnnxModel& model, Planned& planned,
                                const std::vector<std::vector<size_t>>& groups, const std::string& groups_file,
                                kernels::Backend& backend);

// Whether the layers still calibrate once the INT8 set is chosen: the method's record calibrates (AWQ, clip
// search, GPTQ do; RTN does not).
bool calibrates_after_pick(const QuantizeOptions& o);

}  // namespace nibble

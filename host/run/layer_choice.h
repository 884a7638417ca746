// Which pass a calibrated run takes (--layer_by_layer auto|on|off): layer by layer (host/run/layers.h) or the
// whole-model pass, and the one line that says which and why. auto goes layer by layer whenever that helps
// and gives the whole-model pass's codes (fp32; fp16 within one-ulp scale changes, docs/memory.md).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host/run/stages.h"

namespace nibble {

struct LayerChoice {
  std::vector<std::vector<size_t>> groups;  // the plan's weights per layer; empty: the whole-model pass
  std::string why;                          // what decided it (the report's "layer_pass")
  bool layered() const { return !groups.empty(); }
  // {"mode": "layer_by_layer" | "whole_model", "layer_groups": N, "why": ...}
  nlohmann::json to_json() const {
    return {{"mode", layered() ? "layer_by_layer" : "whole_model"}, {"layer_groups", groups.size()}, {"why", why}};
  }
};

// Decides (with a warning where an explicit `on` cannot act), and checks the flags that need a
// layer-by-layer run (--resume, --feed_quantized): Error when they are given to a whole-model run.
LayerChoice choose_layer_pass(const QuantizeOptions& o, const Planned& planned);

// The one progress line that says which pass runs and why; logged once the run's refusals are behind it.
void log_layer_pass(const LayerChoice& c);

}  // namespace nibble

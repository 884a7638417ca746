// host/run/layer_choice.h: what --layer_by_layer auto becomes, and the line that says it.
#include "host/run/layer_choice.h"

#include <spdlog/spdlog.h>

#include "host/algo/mixed_precision.h"
#include "host/run/layer_sensitivity.h"
#include "host/run/layers.h"
#include "loaders/error.h"

namespace nibble {
namespace {

// Why the whole-model pass runs although the flag allows layers; "" when nothing stands in the way but
// the graph. `auto` yields to each reason; `on` only to those it cannot overrule (no calibration).
std::string auto_declines(const QuantizeOptions& o) {
  if (o.arithmetic == Arithmetic::kModelOpt)
    return "--awq_mode modelopt keeps ModelOpt's whole-model calibration (one ONNX Runtime session over the "
           "whole model; layer by layer an fp16 model's statistics differ from it: --layer_by_layer on cuts it "
           "anyway)";
  if (!o.calib.calib_cache.empty())
    return "a statistics cache is given (its entries are the whole model's statistics, to be reused; "
           "--layer_by_layer on drops each layer's instead)";
  return "";
}

LayerChoice decide(const QuantizeOptions& o, const Planned& planned) {
  if (o.layer_by_layer == LayerMode::kOff) return {{}, "--layer_by_layer off"};
  const bool asked = o.layer_by_layer == LayerMode::kOn;
  if (!needs_calibration(o)) {
    std::string why = "--algo " + std::string(name_of(o.algo)) + " runs no calibration (its weights already "
                      "stream one at a time)";
    if (asked) spdlog::warn("--layer_by_layer: no effect: {}", why);
    return {{}, why};
  }
  if (!asked)
    if (std::string why = auto_declines(o); !why.empty()) return {{}, why};
  LayerChoice c;
  c.groups = layer_groups(planned.plan, &c.why);
  if (!c.layered()) {
    c.why = "the graph cannot be cut into layers (" + c.why + ")";
    if (asked) spdlog::warn("--layer_by_layer: {}; running the whole-model pass", c.why);
    return c;
  }
  c.why = asked ? "--layer_by_layer on" : "--layer_by_layer auto: the algorithm calibrates and the graph is cut at its layers";
  return c;
}

}  // namespace

LayerChoice choose_layer_pass(const QuantizeOptions& o, const Planned& planned) {
  LayerChoice c = decide(o, planned);
  if (o.resume && !c.layered())
    throw Error("--resume continues a --layer_by_layer run, and this run takes the whole-model pass (" + c.why + ")");
  if (o.feed_quantized && !c.layered()) {
    if (o.layer_by_layer != LayerMode::kOn)
      throw Error("--feed_quantized feeds the quantized layers forward layer by layer, and this run takes the "
                  "whole-model pass (" + c.why + ")");
    spdlog::warn("--feed_quantized: no effect in the whole-model pass");
  }
  if (o.calibrate_first && !c.layered()) spdlog::warn("--calibrate_first: no effect in the whole-model pass");
  if (!o.calib.calib_cache.empty() && c.layered())
    spdlog::warn("--calib_cache {}: no effect with --layer_by_layer (each layer's statistics are dropped once it "
                 "is written)", o.calib.calib_cache);
  if (c.layered() && o.feed_quantized && mixed_needs_calibration(o) && !calibrates_after_pick(o))
    spdlog::warn("--feed_quantized: no effect: --algo {} calibrates only for the sensitivity sweep, which feeds the "
                 "float layers forward (nothing is quantized before the INT8 set is chosen)", name_of(o.algo));
  return c;
}

void log_layer_pass(const LayerChoice& c) {
  if (c.layered())
    spdlog::info("layer by layer: {} layer groups ({})", c.groups.size(), c.why);
  else
    spdlog::info("the whole-model pass: {}", c.why);
}

}  // namespace nibble

#include "host/methods.h"

#include "host/registry.h"

namespace nibble {
namespace {

constexpr Measures kNone{};
constexpr Measures kScales{true, false, false};
constexpr Measures kClip{false, true, false};
constexpr Measures kScalesAndClip{true, true, false};
constexpr Measures kGptq{false, false, true};
constexpr Measures kScalesAndGptq{true, false, true};

using kernels::RtnArithmetic;
// Plain RTN after the method's search (or none): ModelOpt's symmetric grid, ONNX Runtime's for the RTN
// methods themselves.
constexpr ZeroPointPolicy kOptional = ZeroPointPolicy::kOptional;
constexpr Rounding kRtnGrid{Quantizer::kRtn, kOptional, nullptr, false, RtnArithmetic::kModelOpt, true};
constexpr Rounding kOrtRtn{Quantizer::kRtn, kOptional, nullptr, false, RtnArithmetic::kOnnxRuntime, true};
constexpr Rounding kLsq{Quantizer::kRtnLsq, ZeroPointPolicy::kRefused,
                        "the least-squares scale search is symmetric only (its zero-point form measured worse than "
                        "min/max); --algo rtn_dq --use_zero_point is ONNX Runtime's asymmetric RTN",
                        false, RtnArithmetic::kModelOpt, true};
constexpr Rounding kSearch{Quantizer::kRtnSearch, kOptional, nullptr, false, RtnArithmetic::kModelOpt, true};
constexpr Rounding kHqq{Quantizer::kHqq, ZeroPointPolicy::kAlways, "HQQ fits the zero point", true,
                        RtnArithmetic::kModelOpt, false};

constexpr const char* kNoRtnSearch = "ModelOpt has no RTN search (its RTN is --algo rtn_dq)";
constexpr const char* kNoGptq =
    "ModelOpt has no GPTQ, so there is no arithmetic of its to reproduce (use --awq_mode nibble)";

// The order is --help's: the RTN family, then the calibrated searches, then the later additions; "rtn: the
// same" reads on from rtn_dq.
std::vector<Method> table() {
  return {
      {"rtn_dq", Algo::kRtnDq, kNone, nullptr, Format::kDq,
       "round-to-nearest, DequantizeLinear output, no calibration, fastest; with --awq_mode nibble (default) it "
       "is ONNX Runtime's RTN byte for byte (symmetric: each block's extreme on code -8; with --use_zero_point: "
       "min/max), with --awq_mode modelopt ModelOpt's 15-level amax/7 grid, bit-identical.", kOrtRtn},
      {"rtn", Algo::kRtn, kNone, nullptr, Format::kQdq,
       "the same, QuantizeLinear->DequantizeLinear on the float weight.", kOrtRtn},
      {"rtn_lsq", Algo::kRtnLsq, kNone, kNoRtnSearch, Format::kDq,
       "each block's scale searched by least squares on 16 levels (symmetric; usually 1-2% lower perplexity "
       "than rtn_dq, once 6% higher).", kLsq},
      {"awq_lite", Algo::kAwqLite, kScales, nullptr, Format::kDq,
       "activation-aware scale search (calibration through ONNX Runtime).", kRtnGrid},
      {"awq_clip", Algo::kAwqClip, kClip, nullptr, Format::kDq,
       "per-block clip ratio search on the calibration data.", kRtnGrid},
      {"awq_full", Algo::kAwqFull, kScalesAndClip, nullptr, Format::kDq, "awq_lite then awq_clip.", kRtnGrid},
      {"gptq", Algo::kGptq, kGptq, kNoGptq, Format::kDq,
       "GPTQ (each channel's rounding error compensated on the channels not yet quantized, through the inverse "
       "of XᵀX from calibration).", kRtnGrid},
      {"awq_gptq", Algo::kAwqGptq, kScalesAndGptq, kNoGptq, Format::kDq, "awq_lite's scales, then GPTQ on W ⊙ s.",
       kRtnGrid},
      {"rtn_search", Algo::kRtnSearch, kNone, kNoRtnSearch, Format::kDq,
       "round-to-nearest where each block picks the clip ratio and sign of its scale with the smallest weight "
       "error, no calibration.", kSearch},
      {"hqq", Algo::kHqq, kNone, "ModelOpt has no HQQ (use --awq_mode nibble)", Format::kDq,
       "half-quadratic quantization (each block's zero point by proximal lp-norm iterations, no calibration; "
       "writes zero points, fractional ones in --format matmulnbits).", kHqq},
      {"awq_learned", Algo::kAwqLearned, kScalesAndGptq, kNoGptq, Format::kDq,
       "awq_gptq, then each weight's rounding learned on the layer's output error through XᵀX (AutoRound's sign "
       "steps on a rounding offset per weight, then greedy single-level moves; never worse than GPTQ's on it).",
       kRtnGrid, /*learned_rounding=*/true},
      {"awq_learned_layer", Algo::kAwqLearnedLayer, kScales,
       "ModelOpt has no learned rounding (use --awq_mode nibble)", Format::kDq,
       "awq_lite's scales and codes, then each weight's rounding and each block's scale learned on its whole "
       "decoder layer's output against the float model's (AutoRound's sign steps, the gradient from the layer "
       "engine's reverse pass; layer by layer, on the CPU).",
       kRtnGrid, /*learned_rounding=*/false, /*learns_layers=*/true},
  };
}

}  // namespace

const std::vector<Method>& methods() {
  static const std::vector<Method> all = table();
  return all;
}

const Method& method(Algo a) { return record_of(methods(), &Method::algo, a, "algorithm"); }
const Method* find_method(const std::string& name) { return find_named(methods(), name); }

const char* name_of(Quantizer q) {
  switch (q) {
    case Quantizer::kRtn: return "rtn";
    case Quantizer::kRtnLsq: return "rtn_lsq";
    case Quantizer::kRtnSearch: return "rtn_search";
    case Quantizer::kHqq: return "hqq";
  }
  return "";
}

const char* name_of(ZeroPointPolicy z) {
  switch (z) {
    case ZeroPointPolicy::kOptional: return "optional";
    case ZeroPointPolicy::kAlways: return "always";
    case ZeroPointPolicy::kRefused: return "refused";
  }
  return "";
}

const std::vector<MethodFlag>& method_flags() {
  static const auto gptq = [](const Method& m) { return m.measures.gptq; };
  static const auto learned = [](const Method& m) { return m.learned_rounding; };
  static const auto layers = [](const Method& m) { return m.learns_layers; };
  static const std::vector<MethodFlag> flags = {
      {"gptq_percdamp",
       "GPTQ: dampening added to the diagonal of XᵀX, as a share of its mean (AutoGPTQ's and ONNX Runtime's "
       "default)",
       nullptr, &QuantizeOptions::gptq_percdamp, nullptr, 0, 1, gptq, "runs no GPTQ", true},
      {"gptq_act_order",
       "GPTQ: quantize input channels by decreasing activation energy (blocks stay contiguous: each block's "
       "scale is fixed when the sweep first reaches one of its channels)",
       nullptr, nullptr, &QuantizeOptions::gptq_act_order, 0, 0, gptq, "runs no GPTQ", true},
      {"learned_iters", "awq_learned: sign steps on each weight's rounding offset (AutoRound's update)",
       &QuantizeOptions::learned_iters, nullptr, nullptr, 0, 100000, learned, "learns no rounding", false, true},
      {"learned_lr", "awq_learned: the first sign step, in quantization levels; the steps fall linearly to 0",
       nullptr, &QuantizeOptions::learned_lr, nullptr, 0, 1, learned, "learns no rounding", false, true},
      {"learned_layer_iters", "awq_learned_layer: sign steps per decoder layer, each on --learned_layer_samples calibration samples",
       &QuantizeOptions::learned_layer_iters, nullptr, nullptr, 0, 100000, layers, "learns no layer"},
      {"learned_layer_lr",
       "awq_learned_layer: the first sign step, in quantization levels (0: 1 / --learned_layer_iters); the steps "
       "fall linearly to 0",
       nullptr, &QuantizeOptions::learned_layer_lr, nullptr, 0, 1, layers, "learns no layer"},
      {"learned_layer_samples",
       "awq_learned_layer: calibration samples per step (0: as many as the layer engine joins, up to 1024 tokens)",
       &QuantizeOptions::learned_layer_samples, nullptr, nullptr, 0, 100000, layers, "learns no layer"},
      {"learned_layer_from_gptq",
       "awq_learned_layer: start from awq_gptq's codes and block scales (GPTQ on W ⊙ s in each layer) instead of "
       "awq_lite's",
       nullptr, nullptr, &QuantizeOptions::learned_layer_from_gptq, 0, 0, layers, "learns no layer"},
      {"learned_layer_sweeps",
       "awq_learned_layer: start from awq_learned's codes (awq_gptq's, then greedy single-level moves on each "
       "linear's output error; --learned_iters and --learned_lr act) instead of awq_lite's; implies "
       "--learned_layer_from_gptq",
       nullptr, nullptr, &QuantizeOptions::learned_layer_sweeps, 0, 0, layers, "learns no layer"},
      {"learned_layer_unweighted",
       "awq_learned_layer: every token weighs the same in the layer's output error (by default a token whose float "
       "output is larger than the median token's weighs as much as that one)",
       nullptr, nullptr, &QuantizeOptions::learned_layer_unweighted, 0, 0, layers, "learns no layer"},
  };
  return flags;
}

nlohmann::json flag_value(const MethodFlag& f, const QuantizeOptions& o) {
  if (f.int_value) return o.*f.int_value;
  if (f.double_value) return o.*f.double_value;
  return o.*f.switch_value;
}

bool flag_given(const MethodFlag& f, const QuantizeOptions& o) { return flag_value(f, o) != flag_value(f, {}); }

std::string method_names(bool (*has)(const Method&)) {
  std::vector<const char*> names;
  for (const Method& m : methods())
    if (has(m)) names.push_back(m.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

std::string methods_help() {
  std::string s = "Quantization algorithm (ModelOpt's names).";
  for (const Method& m : methods()) s += std::string(" ") + m.name + ": " + m.summary;
  return s;
}

}  // namespace nibble

// Mixed INT4/INT8 precision : which planned weights get 8 bits.
//   modelopt     ModelOpt's default choice (§7.1): the qkv/v/down projections of ORT-GenAI-named
//                graphs, per group the first and last n/8 in graph order and every third between;
//   layers_8bit  --layers_8bit patterns, matched as token subsequences of node names (§7.2);
//   sensitivity  nibble's own: each weight's output error at 4 and at 8 bits, E = tr(Dᵀ XᵀX D) from
//                the calibration Gram matrix, and 8 bits greedily for the weights that gain most
//                per extra byte, within --mixed_budget (default: the size of the modelopt choice).
// An 8-bit weight is INT8 per output channel (block = K), as ModelOpt writes it (§7.3).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "host/algo/awq.h"
#include "calib/calibration.h"
#include "host/options.h"
#include "host/graph/plan.h"
#include "loaders/onnx_model.h"

namespace nibble {

// Whether any INT8 layers are asked for (--enable_mixed_quant, --layers_8bit, --mixed_strategy).
bool mixed_enabled(const QuantizeOptions& o);
// Whether the strategy needs calibration statistics (sensitivity does, even for RTN).
bool mixed_needs_calibration(const QuantizeOptions& o);
// Throws Error (one line) for a bad --layers_8bit, --mixed_strategy or --mixed_budget.
void validate_mixed_options(const QuantizeOptions& o);

// --layers_8bit: ModelOpt's validation regex, then the comma-separated, stripped patterns.
std::vector<std::string> parse_layers_8bit(const std::string& s);
// ModelOpt's should_quantize_to_8bit: strip one leading '/', '/' -> '.', split on '.', and match
// the pattern's tokens as a contiguous subsequence of the node name's tokens.
bool layer_matches(const std::string& node_name, const std::string& pattern);
// ModelOpt's default choice (§7.1) as node names, from every MatMul/Gemm node of the graph.
std::set<std::string> modelopt_default_8bit_nodes(const onnx::GraphProto& g);

// A --mixed_budget: a share of the quantized elements (0..1) or an output size in bytes.
struct MixedBudget {
  bool is_share = false;
  double share = 0;
  uint64_t bytes = 0;
};
// "0.25" -> share; "300MB", "1.5GiB", "123456B" -> bytes (KB/MB/GB decimal, KiB/MiB/GiB binary).
MixedBudget parse_mixed_budget(const std::string& s);

// How tensor sizes are counted: the payload alone (what ModelOpt's unpadded file holds), with the
// expected alignment padding and protobuf overhead (the writer aligns tensors >= 4 KiB to 4096
// bytes: 2048 on average), or with its upper bound (4095), which an explicit size budget uses.
enum class SizeMode { kPayload, kExpected, kBound };
uint64_t tensor_output_bytes(uint64_t n, SizeMode mode);
// A weight's zero points: none, codes (4/8-bit integers), or floats of the weight's type (hqq's in
// MatMulNBits, 4-bit weights only: 8-bit ones keep codes).
enum class ZeroPoints { kNone, kCodes, kFloat };
ZeroPoints zero_points_of(const QuantizeOptions& o, Format format);
// Bytes a weight adds to the output at `bits` (8: per channel) in `format`.
uint64_t weight_output_bytes(const PlannedWeight& pw, int bits, int64_t block, Format format, ZeroPoints zp,
                             SizeMode mode);

// What the report says about each weight, and the summary.
struct MixedOutcome {
  std::string strategy;
  std::map<std::string, nlohmann::json> per_weight;  // weight -> {precision, why, e4, e8, ...}
  nlohmann::json summary = nlohmann::json::object();
  // Sensitivity layer by layer: the INT8 set was chosen by a first sweep, before the per-layer searches.
  bool picked = false;
};

// Sets bits = 8, block = -1 on the planned weights chosen by the modelopt / layers_8bit strategies.
void apply_static_mixed(const OnnxModel& model, Plan& plan, const QuantizeOptions& o, MixedOutcome* out);

// The sensitivity strategy, after calibration. For AWQ, `choices` holds the 4-bit search; the
// weights that end at 8 bits (and their siblings) are searched again at their precision. It is the
// three steps below in a row; layer by layer runs them apart (measure per layer, pick once, search
// again per layer).
void apply_sensitivity_mixed(OnnxModel& model, Plan& plan, Calibration& calib, const QuantizeOptions& o,
                             Format format, kernels::Backend& backend, std::map<std::string, AwqChoice>* choices,
                             MixedOutcome* out, KeptWeights* kept = nullptr);

// Output error of every weight of `plan` at 4 and at 8 bits: E = tr(Dᵀ XᵀX D) / tokens (the AWQ loss · N),
// with the AWQ scales of `choices` (the 4-bit search; null: s = 1).
void measure_sensitivity(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                         kernels::Backend& backend, const std::map<std::string, AwqChoice>* choices,
                         std::vector<double>* e4, std::vector<double>* e8, KeptWeights* kept = nullptr);
// The greedy choice over the whole plan from every weight's e4/e8 (plan order): sets 8 bits on the chosen
// weights, fills `out` (per weight and summary). Returns the inputs of the INT8 weights.
std::set<std::string> pick_sensitivity(const OnnxModel& model, Plan& plan, const QuantizeOptions& o, Format format,
                                       const std::vector<double>& e4, const std::vector<double>& e8,
                                       MixedOutcome* out);
// AWQ: the weights reading one of `acts8` searched again at their precision, their entries of `choices`
// replaced. `kept` (when given) holds the weights the earlier stages left on the device.
void research_int8(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                   kernels::Backend& backend, const std::set<std::string>& acts8,
                   std::map<std::string, AwqChoice>* choices, KeptWeights* kept = nullptr);
// The inputs of the plan's 8-bit weights.
std::set<std::string> int8_activations(const Plan& plan);
// The plan as it was before any INT8 pick: 8-bit weights back at 4 bits with `block` (--block_size).
Plan at_four_bits(const Plan& plan, int64_t block);

}  // namespace nibble

#include "host/algo/mixed_precision.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <regex>

#include "host/algo/arithmetic.h"
#include "host/algo/awq_parts.h"
#include "host/formats.h"
#include "host/graph/rewrite.h"
#include "host/methods.h"
#include "host/text.h"
#include "loaders/error.h"
#include "loaders/tensor_view.h"

namespace nibble {
namespace {

std::vector<std::string> tokens(const std::string& s) {
  std::string t = s;
  if (!t.empty() && t[0] == '/') t = t.substr(1);  // Python lstrip("/") strips every leading '/'
  while (!t.empty() && t[0] == '/') t = t.substr(1);
  std::replace(t.begin(), t.end(), '/', '.');
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= t.size(); ++i)
    if (i == t.size() || t[i] == '.') {
      out.push_back(t.substr(start, i - start));  // empty tokens kept, as str.split does
      start = i + 1;
    }
  return out;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// ModelOpt's layer_info key is the weight; with several consumer nodes the last one decides.
std::string deciding_node(const OnnxModel& model, const PlannedWeight& pw) {
  return model.proto().graph().node(pw.nodes.back()).name();
}

void set_int8(PlannedWeight& pw) {
  pw.bits = 8;
  pw.block = -1;
}

}  // namespace

uint64_t tensor_output_bytes(uint64_t n, SizeMode mode) {
  if (mode == SizeMode::kPayload) return n;
  // Small tensors stay inline in the graph; big ones are aligned (up to 4095 bytes of padding).
  if (n < ModelWriter::kInlineThreshold) return n + 64;
  const uint64_t align = ModelWriter::alignment(n);
  const uint64_t pad = mode == SizeMode::kBound ? align - 1 : align / 2;
  return n + pad + 128;
}

bool mixed_enabled(const QuantizeOptions& o) { return o.mixed_strategy() != MixedStrategy::kNone; }

bool mixed_needs_calibration(const QuantizeOptions& o) { return o.mixed_strategy() == MixedStrategy::kSensitivity; }

void validate_mixed_options(const QuantizeOptions& o) {
  if (!o.layers_8bit.empty()) {
    parse_layers_8bit(o.layers_8bit);
    if (o.mixed_strategy_flag == MixedStrategy::kSensitivity)
      throw Error("--layers_8bit names the INT8 layers itself: it cannot be combined with --mixed_strategy sensitivity");
  }
  if (!o.mixed_budget.empty()) {
    parse_mixed_budget(o.mixed_budget);
    if (o.mixed_strategy() != MixedStrategy::kSensitivity)
      throw Error("--mixed_budget applies to --mixed_strategy sensitivity only");
  }
}

std::vector<std::string> parse_layers_8bit(const std::string& s) {
  static const std::regex valid(R"(^\s*[/a-zA-Z0-9_.\-]+(\s*,\s*[/a-zA-Z0-9_.\-]+)*\s*$)");
  if (!std::regex_match(s, valid))
    throw Error("--layers_8bit '" + s +
                "' is not a comma-separated list of layer names (letters, digits, '/', '.', '_', '-'), "
                "e.g. layers.0,mlp/down_proj");
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == ',') {
      std::string p = trim(s.substr(start, i - start));
      if (!p.empty()) out.push_back(p);
      start = i + 1;
    }
  return out;
}

bool layer_matches(const std::string& node_name, const std::string& pattern) {
  const auto hay = tokens(node_name), needle = tokens(pattern);
  if (needle.size() > hay.size()) return false;
  for (size_t i = 0; i + needle.size() <= hay.size(); ++i)
    if (std::equal(needle.begin(), needle.end(), hay.begin() + long(i))) return true;
  return false;
}

std::set<std::string> modelopt_default_8bit_nodes(const onnx::GraphProto& g) {
  static const std::vector<std::regex> patterns = {
      std::regex(R"(^/model/layers\.(\d+)/attn/qkv_proj/MatMul$)"),
      std::regex(R"(^/model/layers\.(\d+)/attn/v_proj/MatMul$)"),
      std::regex(R"(^/model/layers\.(\d+)/self_attn/qkv_proj/MatMul$)"),
      std::regex(R"(^/model/layers\.(\d+)/self_attn/v_proj/MatMul$)"),
      std::regex(R"(^/model/layers\.(\d+)/mlp/down_proj/MatMul$)"),
  };
  // Groups in order of first appearance; members in graph order (ModelOpt's sort key is always 0).
  std::vector<std::string> group_order;
  std::map<std::string, std::vector<std::string>> groups;
  for (const auto& n : g.node()) {
    if (n.op_type() != "MatMul" && n.op_type() != "Gemm") continue;
    if (n.name().find("lm_head") != std::string::npos) continue;
    bool hit = false;
    for (const auto& re : patterns)
      if (std::regex_match(n.name(), re)) hit = true;
    if (!hit) continue;
    std::vector<std::string> parts;
    size_t start = 0;
    const std::string& name = n.name();
    for (size_t i = 0; i <= name.size(); ++i)
      if (i == name.size() || name[i] == '/') {
        parts.push_back(name.substr(start, i - start));
        start = i + 1;
      }
    const std::string key = parts.size() >= 3 ? parts[parts.size() - 3] + "." + parts[parts.size() - 2] : name;
    if (!groups.count(key)) group_order.push_back(key);
    groups[key].push_back(name);
  }
  std::set<std::string> out;
  for (const auto& key : group_order) {
    const auto& names = groups[key];
    const int64_t n = int64_t(names.size()), e = n / 8;
    for (int64_t i = 0; i < n; ++i)
      if (i < e || i >= n - e || (i - e) % 3 == 0) out.insert(names[size_t(i)]);
  }
  return out;
}

MixedBudget parse_mixed_budget(const std::string& s) {
  const std::string t = trim(s);
  auto bad = [&]() {
    return Error("--mixed_budget '" + s +
                 "' is neither a share of the weights in [0, 1] nor an output size like 300MB");
  };
  if (t.empty()) throw bad();
  const char* begin = t.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) throw bad();
  std::string unit = trim(std::string(end));
  MixedBudget b;
  if (unit.empty()) {
    if (v < 0 || v > 1)
      throw Error("--mixed_budget " + s + " is out of range: a share must be in [0, 1] (or give a size like 300MB)");
    b.is_share = true;
    b.share = v;
    return b;
  }
  if (!(v > 0)) throw Error("--mixed_budget " + s + " is out of range: a size must be positive");
  try {
    b.bytes = parse_size(t, "--mixed_budget");
  } catch (const Error&) {
    throw bad();
  }
  if (b.bytes > uint64_t(1e18)) throw Error("--mixed_budget " + s + " is out of range: at most 1e18 bytes");
  return b;
}

ZeroPoints zero_points_of(const QuantizeOptions& o, Format format) {
  if (!o.zero_point()) return ZeroPoints::kNone;
  const bool fractional = method(o.algo).rounding.fractional_zero_points;
  return fractional && format_record(format).float_zero_point_bits ? ZeroPoints::kFloat : ZeroPoints::kCodes;
}

namespace {

// ONNX Runtime's MatMulNBits layout: codes [N, G, block·bits/8] in whole (padded) blocks of the layout's block
// (matmulnbits_layout_block), scales [N, G], zero points packed per row of N or float ones.
uint64_t matmulnbits_bytes(const PlannedWeight& pw, int bits, int64_t block, const FormatRecord& f, ZeroPoints zps,
                           SizeMode mode) {
  uint64_t total = 0;
  auto add = [&](uint64_t n) { total += tensor_output_bytes(n, mode); };
  const bool zp = zps != ZeroPoints::kNone, per_channel = bits == 8 || block < 0;
  const uint64_t K = uint64_t(pw.K()), N = uint64_t(pw.N()), dsz = dtype_size(pw.dtype);
  kernels::QuantSpec spec{bits, per_channel ? int64_t(K) : block, zp};
  PlannedWeight as = pw;
  as.bits = bits;
  as.block = per_channel ? -1 : block;
  const int64_t lb = matmulnbits_layout_block(as, spec);
  const uint64_t Gl = (K + uint64_t(lb) - 1) / uint64_t(lb);
  add(N * Gl * uint64_t(lb) * uint64_t(bits) / 8);
  add(N * Gl * dsz);
  if (zps == ZeroPoints::kFloat && bits == f.float_zero_point_bits) add(N * Gl * dsz);  // else codes (see emit.cc)
  else if (zp) add(N * (bits == 8 ? Gl : (Gl + 1) / 2));
  return total;
}

// DequantizeLinear's layout: codes [K, N] (or the float weight the format keeps), scales and zero points per
// block of K; QuantizeLinear (a format that keeps the float weight) takes a zero point input always.
uint64_t dequantize_linear_bytes(const PlannedWeight& pw, int bits, int64_t block, const FormatRecord& f,
                                 ZeroPoints zps, SizeMode mode) {
  uint64_t total = 0;
  auto add = [&](uint64_t n) { total += tensor_output_bytes(n, mode); };
  const uint64_t K = uint64_t(pw.K()), N = uint64_t(pw.N()), el = K * N, dsz = dtype_size(pw.dtype);
  const uint64_t bs = bits == 8 || block < 0 ? K : uint64_t(block);
  const uint64_t G = (K + bs - 1) / bs;
  if (f.keeps_float_weight) add(el * dsz);
  else add(bits == 4 ? (el + 1) / 2 : el);
  add(G * N * dsz);
  if (zps != ZeroPoints::kNone || f.keeps_float_weight) add(bits == 4 ? (G * N + 1) / 2 : G * N);
  return total;
}

}  // namespace

uint64_t weight_output_bytes(const PlannedWeight& pw, int bits, int64_t block, Format format, ZeroPoints zps,
                             SizeMode mode) {
  const uint64_t protos = mode == SizeMode::kPayload ? 0 : 256;  // nodes and tensor protos
  const FormatRecord& f = format_record(format);
  switch (f.bytes) {
    case ByteModel::kMatMulNBits: return protos + matmulnbits_bytes(pw, bits, block, f, zps, mode);
    case ByteModel::kDequantizeLinear: break;
  }
  return protos + dequantize_linear_bytes(pw, bits, block, f, zps, mode);
}

void apply_static_mixed(const OnnxModel& model, Plan& plan, const QuantizeOptions& o, MixedOutcome* out) {
  const MixedStrategy strategy = o.mixed_strategy();
  const bool by_flag = strategy == MixedStrategy::kLayers8bit;
  out->strategy = name_of(strategy);
  std::vector<std::string> patterns;
  std::set<std::string> defaults;
  if (by_flag) {
    patterns = parse_layers_8bit(o.layers_8bit);
  } else {
    defaults = modelopt_default_8bit_nodes(model.proto().graph());
    patterns.assign(defaults.begin(), defaults.end());  // ModelOpt matches its own set the same way
  }
  int64_t n8 = 0;
  for (auto& pw : plan.weights) {
    const std::string node = deciding_node(model, pw);
    std::string hit;
    for (const auto& p : patterns)
      if (layer_matches(node, p)) {
        hit = p;
        break;
      }
    nlohmann::json j;
    if (!hit.empty()) {
      set_int8(pw);
      ++n8;
      j["precision"] = 8;
      j["why"] = by_flag
                     ? "--layers_8bit pattern '" + hit + "' matches node " + node
                     : "ModelOpt's default choice (qkv/v/down projections: first and last n/8 of the group, "
                       "every third between) selects " + hit;
    } else {
      j["precision"] = 4;
      j["why"] = by_flag ? "no --layers_8bit pattern matches node " + node
                                           : "not in ModelOpt's default INT8 set";
    }
    out->per_weight[pw.weight] = j;
  }
  out->summary = {{"strategy", out->strategy}, {"int8_weights", n8}, {"int4_weights", int64_t(plan.weights.size()) - n8}};
  if (strategy == MixedStrategy::kModelopt && defaults.empty())
    spdlog::warn("--enable_mixed_quant: no node is named like ORT-GenAI's /model/layers.N/(self_)attn/qkv_proj|v_proj "
                 "or mlp/down_proj MatMul, so ModelOpt's default choice keeps every weight at 4 bits "
                 "(use --layers_8bit or --mixed_strategy sensitivity)");
  spdlog::info("mixed precision ({}): {} of {} weights INT8", out->strategy, n8, plan.weights.size());
}

// Output error of every weight at 4 and at 8 bits: E = tr(Dᵀ XᵀX D) / tokens (the AWQ loss · N).
void measure_sensitivity(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                         kernels::Backend& backend, const std::map<std::string, AwqChoice>* choices,
                         std::vector<double>* e4, std::vector<double>* e8, KeptWeights* kept) {
  const bool awq = choices != nullptr, zp = o.zero_point();
  e4->assign(plan.weights.size(), 0);
  e8->assign(plan.weights.size(), 0);
  for (const auto& [act, idx] : plan.siblings) {
    const ActivationStats st = calib.stats(act, /*numpy_mean=*/false);  // K and rows: either mean
    std::vector<float> g32;
    // On a device: G goes up once for the sibling weights (or is made there from the layer engine's XᵀX),
    // each weight once (for its two losses here, the AWQ search before and the quantizer after, when `kept`
    // holds it).
    kernels::GramForm g;
    g.K = st.K;
    g.rows = st.rows;
    g.gram = backend.upload(awq_parts::gram_f32_for_loss(backend, calib, act, calib.gram_tensor(act, st.K), g32));
    for (size_t i : idx) {
      const PlannedWeight& pw = plan.weights[i];
      TensorView v = model.view(*model.initializer(pw.weight));
      const kernels::WeightMatrix w = keep_weight(backend, kept, pw, v.data);
      std::vector<float> ones(size_t(pw.K()), 1.0f);
      const float* s = awq ? choices->at(pw.weight).scale.data() : ones.data();
      const std::vector<float>* clip = awq ? awq_quantizer_clip_ratios(o) : nullptr;
      kernels::QuantSpec s4{4, pw.resolved_block(), zp};
      kernels::QuantSpec s8{8, pw.K(), zp};
      (*e4)[i] = backend.awq_losses(w, {s}, s4, g, clip)[0] * double(pw.N());
      (*e8)[i] = backend.awq_losses(w, {s}, s8, g, clip)[0] * double(pw.N());
      model.release(v);
    }
  }
}

namespace {

// Output sizes at 4 and 8 bits of every weight (b: as counted against the budget, p: payload only)
// and of what is not quantized (see SizeMode): an explicit size budget is checked against the upper
// bound of our file; the default budget is the size of ModelOpt's choice written without padding (as
// ModelOpt writes it), checked against our expected size, so that nibble's file is no larger.
struct Sizes {
  std::vector<uint64_t> b4, b8, p4, p8;
  uint64_t all4 = 0, fixed_payload = 0, elems = 0;
};

Sizes weight_sizes(const OnnxModel& model, const Plan& plan, Format format, ZeroPoints zp, SizeMode mode) {
  Sizes z;
  uint64_t fixed = uint64_t(model.proto().ByteSizeLong());
  z.fixed_payload = fixed;
  std::set<std::string> planned;
  for (const auto& pw : plan.weights)
    if (!pw.keep_float && !format_record(format).keeps_float_weight) planned.insert(pw.weight);
  for (const auto& t : model.proto().graph().initializer())
    if (t.data_location() == onnx::TensorProto::EXTERNAL && !planned.count(t.name())) {
      fixed += tensor_output_bytes(expected_nbytes(t), mode);
      z.fixed_payload += expected_nbytes(t);
    }
  z.all4 = fixed;
  for (const auto& pw : plan.weights) {
    z.b4.push_back(weight_output_bytes(pw, 4, pw.block, format, zp, mode));
    z.b8.push_back(weight_output_bytes(pw, 8, -1, format, zp, mode));
    z.p4.push_back(weight_output_bytes(pw, 4, pw.block, format, zp, SizeMode::kPayload));
    z.p8.push_back(weight_output_bytes(pw, 8, -1, format, zp, SizeMode::kPayload));
    z.all4 += z.b4.back();
    z.elems += uint64_t(pw.rows * pw.cols);
  }
  return z;
}

// The default budget: the size of ModelOpt's default choice on this model.
MixedBudget modelopt_choice_budget(const OnnxModel& model, const Plan& plan, const Sizes& z, std::string* desc) {
  const std::set<std::string> mo_nodes = modelopt_default_8bit_nodes(model.proto().graph());
  MixedBudget budget;
  budget.bytes = z.fixed_payload;
  int64_t n_mo = 0;
  for (size_t i = 0; i < plan.weights.size(); ++i) {
    bool hit = false;
    for (const auto& p : mo_nodes) hit = hit || layer_matches(deciding_node(model, plan.weights[i]), p);
    budget.bytes += hit ? z.p8[i] : z.p4[i];
    n_mo += hit;
  }
  *desc = "size of ModelOpt's default choice (" + std::to_string(n_mo) + " INT8 weights), " +
          std::to_string(budget.bytes) + " bytes";
  if (n_mo == 0)
    spdlog::warn("--mixed_strategy sensitivity: ModelOpt's default choice selects no weight of this model (its "
                 "names are not ORT-GenAI's), so the default budget allows no INT8 weight; set --mixed_budget");
  return budget;
}

// What the greedy choice ends with.
struct Picked {
  int64_t n8 = 0;
  uint64_t used = 0, used_elems = 0;
  std::set<std::string> acts8;  // inputs of the INT8 weights
};

// Greedy: largest error reduction per extra byte first; a weight that does not fit is skipped.
Picked pick_int8(Plan& plan, const std::vector<double>& e4, const std::vector<double>& e8, const Sizes& z,
                 const MixedBudget& budget, MixedOutcome* out) {
  const size_t W = plan.weights.size();
  std::vector<size_t> order(W);
  std::iota(order.begin(), order.end(), 0);
  auto gain_per_byte = [&](size_t i) {
    const double extra = double(z.p8[i] > z.p4[i] ? z.p8[i] - z.p4[i] : 1);
    return (e4[i] - e8[i]) / extra;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gain_per_byte(a) > gain_per_byte(b); });
  Picked k;
  k.used = z.all4;
  const uint64_t elem_budget = budget.is_share ? uint64_t(std::floor(budget.share * double(z.elems))) : 0;
  for (size_t r = 0; r < W; ++r) {
    const size_t i = order[r];
    PlannedWeight& pw = plan.weights[i];
    const uint64_t el = uint64_t(pw.rows * pw.cols);
    nlohmann::json j = {{"e4", e4[i]}, {"e8", e8[i]}, {"rank", r + 1}, {"gain_per_byte", gain_per_byte(i)},
                        {"bytes_int4", z.p4[i]}, {"bytes_int8", z.p8[i]}};
    const bool fits =
        budget.is_share ? k.used_elems + el <= elem_budget : k.used - z.b4[i] + z.b8[i] <= budget.bytes;
    char buf[160];
    j["precision"] = 4;
    if (!(e4[i] > e8[i])) {
      std::snprintf(buf, sizeof buf, "rank %zu of %zu: 8 bits do not lower its output error", r + 1, W);
    } else {
      std::snprintf(buf, sizeof buf, "rank %zu of %zu by (E4 - E8) / extra byte = %.3g; %s", r + 1, W,
                    gain_per_byte(i), fits ? "fits the budget" : "over the budget");
      if (fits) {
        j["precision"] = 8;
        set_int8(pw);
        k.used = k.used - z.b4[i] + z.b8[i];
        k.used_elems += el;
        ++k.n8;
        k.acts8.insert(pw.activation);
      }
    }
    j["why"] = buf;
    out->per_weight[pw.weight] = j;
  }
  return k;
}

}  // namespace

std::set<std::string> pick_sensitivity(const OnnxModel& model, Plan& plan, const QuantizeOptions& o, Format format,
                                       const std::vector<double>& e4, const std::vector<double>& e8,
                                       MixedOutcome* out) {
  out->strategy = "sensitivity";
  const size_t W = plan.weights.size();
  const SizeMode mode = o.mixed_budget.empty() ? SizeMode::kExpected : SizeMode::kBound;
  const Sizes z = weight_sizes(model, plan, format, zero_points_of(o, format), mode);
  // The budget: a share of the elements, an output size, or (default) the size of ModelOpt's choice.
  std::string budget_desc = o.mixed_budget;
  const MixedBudget budget = o.mixed_budget.empty() ? modelopt_choice_budget(model, plan, z, &budget_desc)
                                                    : parse_mixed_budget(o.mixed_budget);
  const Picked k = pick_int8(plan, e4, e8, z, budget, out);
  out->summary = {{"strategy", "sensitivity"},
                  {"int8_weights", k.n8},
                  {"int4_weights", int64_t(W) - k.n8},
                  {"budget", budget_desc},
                  {"budget_bytes", budget.is_share ? nlohmann::json(nullptr) : nlohmann::json(budget.bytes)},
                  {"budget_share", budget.is_share ? nlohmann::json(budget.share) : nlohmann::json(nullptr)},
                  {"predicted_output_bytes", k.used},
                  {"int8_share", z.elems ? double(k.used_elems) / double(z.elems) : 0.0},
                  {"all_int4_output_bytes", z.all4}};
  spdlog::info("mixed precision (sensitivity): {} of {} weights INT8 ({:.1f}% of the elements), budget {}, "
               "predicted output {} (all INT4: {})",
               k.n8, W, z.elems ? 100.0 * double(k.used_elems) / double(z.elems) : 0.0,
               budget.is_share ? std::to_string(budget.share) + " of the elements" : human_bytes(budget.bytes),
               human_bytes(k.used), human_bytes(z.all4));
  return k.acts8;
}

std::set<std::string> int8_activations(const Plan& plan) {
  std::set<std::string> acts;
  for (const auto& pw : plan.weights)
    if (pw.bits == 8) acts.insert(pw.activation);
  return acts;
}

Plan at_four_bits(const Plan& plan, int64_t block) {
  Plan four = plan;
  for (auto& pw : four.weights)
    if (pw.bits == 8) {
      pw.bits = 4;
      pw.block = block;
    }
  return four;
}

void research_int8(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                   kernels::Backend& backend, const std::set<std::string>& acts8,
                   std::map<std::string, AwqChoice>* choices, KeptWeights* kept) {
  Plan sub;
  for (const auto& pw : plan.weights)
    if (acts8.count(pw.activation)) sub.weights.push_back(pw);
  if (sub.weights.empty()) return;
  for (size_t i = 0; i < sub.weights.size(); ++i) sub.siblings[sub.weights[i].activation].push_back(i);
  spdlog::info("awq-lite: searching again the {} weights that share an input with an INT8 weight", sub.weights.size());
  auto again = search_awq_scales(model, sub, calib, o, backend, nullptr, kept);
  for (auto& [name, c] : again) (*choices)[name] = std::move(c);
}

void apply_sensitivity_mixed(OnnxModel& model, Plan& plan, Calibration& calib, const QuantizeOptions& o,
                             Format format, kernels::Backend& backend, std::map<std::string, AwqChoice>* choices,
                             MixedOutcome* out, KeptWeights* kept) {
  std::vector<double> e4, e8;
  measure_sensitivity(model, plan, calib, o, backend, choices, &e4, &e8, kept);
  const std::set<std::string> acts8 = pick_sensitivity(model, plan, o, format, e4, e8, out);
  // AWQ: the INT8 weights (and their siblings, which share s) are searched again at their precision.
  if (choices) research_int8(model, plan, calib, o, backend, acts8, choices, kept);
}

}  // namespace nibble

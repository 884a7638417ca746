#include "host/graph/plan.h"

#include <cstdint>
#include <limits>
#include <regex>
#include <set>
#include <string>
#include <unordered_map>

#include "host/graph/gather_plan.h"
#include "loaders/error.h"

namespace nibble {
namespace {

bool is_default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }



// "/model/layers.12/attn/qkv_proj/MatMul" -> "attn/qkv_proj"
std::string role_of(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= name.size(); ++i)
    if (i == name.size() || name[i] == '/') {
      if (i > start) parts.push_back(name.substr(start, i - start));
      start = i + 1;
    }
  if (parts.size() >= 3) return parts[parts.size() - 3] + "/" + parts[parts.size() - 2];
  if (parts.size() == 2) return parts[0];
  return name;
}

}  // namespace

// The first place where one of the words layers/layer/blocks/h is followed by a separator
// [./_], a run of digits, and a separator or the end of the name (what the regex
// (?:layers|layer|blocks|h)[./_](\d+)(?:[./_]|$) would find, scanned by hand: a std::regex
// recurses once per character and overflows the stack on names of hundreds of KB, and std::stoi
// throws on a digit run that does not fit). Linear in the name's length.
int layer_index(const std::string& name) {
  static const char* const kWords[] = {"layers", "layer", "blocks", "h"};
  auto is_sep = [](char c) { return c == '.' || c == '/' || c == '_'; };
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  const size_t n = name.size();
  for (size_t i = 0; i < n; ++i) {
    for (const char* word : kWords) {
      const size_t len = std::char_traits<char>::length(word);
      if (name.compare(i, len, word) != 0) continue;
      size_t j = i + len;
      if (j >= n || !is_sep(name[j])) continue;
      const size_t d0 = ++j;
      int64_t value = 0;
      bool fits = true;
      while (j < n && is_digit(name[j])) {
        value = value * 10 + (name[j] - '0');
        if (value > std::numeric_limits<int>::max()) {
          fits = false;
          value = 0;  // keep scanning the run; the result is -1 anyway
        }
        ++j;
      }
      if (j == d0 || (j < n && !is_sep(name[j]))) continue;  // no digits, or digits then a letter
      return fits ? int(value) : -1;
    }
  }
  return -1;
}

Excludes compile_excludes(const std::vector<std::string>& patterns) {
  Excludes excludes;
  for (const auto& p : patterns) {
    try {
      excludes.emplace_back(p, std::regex(p, std::regex::ECMAScript));
    } catch (const std::regex_error& e) {
      throw Error("--nodes_to_exclude: '" + p + "' is not a valid regular expression (" + e.what() + ")");
    }
  }
  return excludes;
}

const std::string* excluded_by(const Excludes& excludes, const std::string& name) {
  for (const auto& [pattern, re] : excludes)
    if (std::regex_search(name, re, std::regex_constants::match_continuous)) return &pattern;
  return nullptr;
}

namespace {

// The constant 2-D float weight node n multiplies by, or null; *why is set when n is skipped for a
// reason worth reporting (an activation x activation MatMul is not reported: it has no weight).
const onnx::TensorProto* weight_of(const OnnxModel& model, const onnx::NodeProto& n, const Excludes& excludes,
                                   std::string* why) {
  if (const std::string* pattern = excluded_by(excludes, n.name())) {
    *why = "excluded by --nodes_to_exclude '" + *pattern + "'";
    return nullptr;
  }
  const onnx::TensorProto* w = model.initializer(n.input(1));
  if (!w) return nullptr;
  const DType dt = static_cast<DType>(w->data_type());
  if (model.initializer(n.input(0))) *why = "both inputs are constants";
  else if (w->dims_size() != 2) *why = "weight '" + w->name() + "' has rank " + std::to_string(w->dims_size()) + ", not 2";
  else if (dt == DType::kFloat64)
    throw Error("weight '" + w->name() + "' of node '" + n.name() + "' is fp64: nibble quantizes fp32, fp16 and bf16 weights");
  else if (!is_quantizable_float(dt)) *why = "weight '" + w->name() + "' is " + dtype_name(w->data_type()) + ", not a float type";
  else if (w->dims(0) == 0 || w->dims(1) == 0) *why = "weight '" + w->name() + "' is empty";
  return why->empty() ? w : nullptr;
}

PlannedWeight planned_weight(const onnx::NodeProto& n, int i, const onnx::TensorProto& w, int k_axis,
                             const PlanOptions& options) {
  PlannedWeight pw;
  pw.weight = w.name();
  pw.nodes = {i};
  pw.node_name = n.name();
  pw.op_type = n.op_type();
  pw.activation = n.input(0);
  pw.k_axis = k_axis;
  pw.rows = w.dims(0);
  pw.cols = w.dims(1);
  pw.dtype = static_cast<DType>(w.data_type());
  pw.layer = layer_index(n.name());
  pw.role = role_of(n.name());
  pw.bits = options.bits;
  pw.block = options.block_size;
  return pw;
}

// Drops weights read along K by one node and along N by another (they cannot share one
// quantization), marks those something else still reads as float, and groups siblings.
void finish_plan(const onnx::GraphProto& g, const std::set<std::string>& conflicting, Plan& plan) {
  std::unordered_map<std::string, int> uses;  // every reader of every tensor name
  for (const auto& n : g.node())
    for (const auto& in : n.input()) ++uses[in];
  for (const auto& o : g.output()) ++uses[o.name()];
  std::vector<PlannedWeight> kept;
  for (auto& pw : plan.weights) {
    if (conflicting.count(pw.weight)) {
      for (int i : pw.nodes)
        plan.skipped.push_back({g.node(i).name(), g.node(i).op_type(),
                                "weight '" + pw.weight + "' is shared with and without transB"});
      continue;
    }
    pw.keep_float = uses[pw.weight] > int(pw.nodes.size());
    for (const auto& gi : g.output())
      if (gi.name() == pw.weight) pw.keep_float = true;
    kept.push_back(std::move(pw));
  }
  plan.weights = std::move(kept);
  for (size_t i = 0; i < plan.weights.size(); ++i) plan.siblings[plan.weights[i].activation].push_back(i);
}

}  // namespace

Plan make_plan(const OnnxModel& model, const PlanOptions& options) {
  const Excludes excludes = compile_excludes(options.nodes_to_exclude);
  const auto& g = model.proto().graph();
  Plan plan;
  std::unordered_map<std::string, size_t> by_weight;  // initializer -> index in plan.weights
  std::set<std::string> conflicting;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    if (!is_default_domain(n.domain()) || (n.op_type() != "MatMul" && n.op_type() != "Gemm")) continue;
    if (n.input_size() < 2) continue;
    std::string why;
    const onnx::TensorProto* w = weight_of(model, n, excludes, &why);
    if (!why.empty()) plan.skipped.push_back({n.name(), n.op_type(), why});
    if (!w) continue;
    const int k_axis = n.op_type() == "Gemm" && int_attr(n, "transB", 0) != 0 ? 1 : 0;
    auto it = by_weight.find(w->name());
    if (it != by_weight.end()) {
      PlannedWeight& pw = plan.weights[it->second];
      if (pw.k_axis != k_axis) conflicting.insert(w->name());
      pw.nodes.push_back(i);
      continue;
    }
    by_weight.emplace(w->name(), plan.weights.size());
    plan.weights.push_back(planned_weight(n, i, *w, k_axis, options));
  }
  finish_plan(g, conflicting, plan);
  if (options.gather_axis) plan_gathers(model, options, excludes, plan);
  else note_float_gathers(model, plan);
  return plan;
}

}  // namespace nibble

#include "host/graph/opset.h"

#include <map>
#include <vector>

#include "loaders/error.h"

namespace nibble {
namespace {

// Default-domain ops whose inputs/attributes changed incompatibly at these opset versions
// (from the ONNX operator changelog). Ops not listed kept their meaning from opset 10 to 21.
const std::map<std::string, std::vector<int64_t>>& breaking_changes() {
  static const std::map<std::string, std::vector<int64_t>> table = {
      {"ReduceSum", {13}},       {"ReduceMean", {18}},      {"ReduceMax", {18}},
      {"ReduceMin", {18}},       {"ReduceProd", {18}},      {"ReduceL1", {18}},
      {"ReduceL2", {18}},        {"ReduceLogSum", {18}},    {"ReduceLogSumExp", {18}},
      {"ReduceSumSquare", {18}}, {"Squeeze", {13}},         {"Unsqueeze", {13}},
      {"Split", {13}},           {"Softmax", {13}},         {"LogSoftmax", {13}},
      {"Hardmax", {13}},         {"Pad", {11}},             {"Resize", {11}},
      {"Clip", {11}},            {"Slice", {10}},           {"TopK", {10}},
      {"Upsample", {10}},        {"Dropout", {12}},         {"GroupNormalization", {21}},
      {"DFT", {20}},             {"Scatter", {11}},
  };
  return table;
}

bool is_default(const std::string& d) { return d.empty() || d == "ai.onnx"; }

}  // namespace

void raise_default_opset(onnx::ModelProto& model, int64_t target) {
  onnx::OperatorSetIdProto* def = nullptr;
  for (auto& o : *model.mutable_opset_import())
    if (is_default(o.domain())) def = &o;
  if (!def) {
    def = model.add_opset_import();
    def->set_domain("");
    def->set_version(target);
    return;
  }
  const int64_t from = def->version();
  if (from >= target) return;
  if (from < 10)
    throw Error("the model imports ONNX opset " + std::to_string(from) +
                "; nibble needs at least opset 10 (upgrade it with onnx.version_converter)");
  const auto& table = breaking_changes();
  for (const auto& n : model.graph().node()) {
    if (!is_default(n.domain())) continue;
    auto it = table.find(n.op_type());
    if (it == table.end()) continue;
    for (int64_t v : it->second)
      if (v > from && v <= target)
        throw Error("format needs ONNX opset " + std::to_string(target) + " but the model is opset " +
                    std::to_string(from) + " and uses " + n.op_type() + " (node '" + n.name() +
                    "'), whose definition changed in opset " + std::to_string(v) +
                    ": use --format matmulnbits, or upgrade the model with onnx.version_converter");
  }
  def->set_version(target);
}

void ensure_domain(onnx::ModelProto& model, const std::string& domain, int64_t version) {
  for (const auto& o : model.opset_import())
    if (o.domain() == domain) return;
  auto* o = model.add_opset_import();
  o->set_domain(domain);
  o->set_version(version);
}

}  // namespace nibble

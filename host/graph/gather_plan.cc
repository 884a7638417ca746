#include "host/graph/gather_plan.h"

#include <cstring>
#include <unordered_map>

#include "loaders/error.h"

namespace nibble {
namespace {

bool is_table_gather(const OnnxModel& model, const onnx::NodeProto& n) {
  return (n.domain().empty() || n.domain() == "ai.onnx") && n.op_type() == "Gather" && n.input_size() == 2 &&
         model.initializer(n.input(0)) != nullptr;
}

// Why the table of Gather n cannot be quantized, or "" when it can.
std::string why_not(const OnnxModel& model, const onnx::NodeProto& n, const Excludes& excludes) {
  if (const std::string* pattern = excluded_by(excludes, n.name()))
    return "excluded by --nodes_to_exclude '" + *pattern + "'";
  const onnx::TensorProto& t = *model.initializer(n.input(0));
  const DType dt = static_cast<DType>(t.data_type());
  if (t.dims_size() != 2) return "data '" + t.name() + "' has rank " + std::to_string(t.dims_size()) + ", not 2";
  if (dt == DType::kFloat64)
    throw Error("embedding '" + t.name() + "' of node '" + n.name() +
                "' is fp64: nibble quantizes fp32, fp16 and bf16");
  if (!is_quantizable_float(dt))
    return "data '" + t.name() + "' is " + dtype_name(t.data_type()) + ", not a float type";
  if (t.dims(0) == 0 || t.dims(1) == 0) return "data '" + t.name() + "' is empty";
  if (model.initializer(n.input(1))) return "both inputs are constants";
  if (int_attr(n, "axis", 0) != 0) return "gathers along axis " + std::to_string(int_attr(n, "axis", 0)) + ", not 0";
  return "";
}

PlannedWeight planned_table(const onnx::NodeProto& n, int i, const onnx::TensorProto& t, const PlanOptions& o) {
  PlannedWeight pw;
  pw.weight = t.name();
  pw.nodes = {i};
  pw.node_name = n.name();
  pw.op_type = "Gather";
  pw.activation = n.input(1);
  pw.k_axis = *o.gather_axis;  // blocks along axis 1 of [V, H] read like Gemm transB's [N, K]
  pw.rows = t.dims(0);
  pw.cols = t.dims(1);
  pw.dtype = static_cast<DType>(t.data_type());
  pw.layer = -1;
  pw.role = "embedding";
  pw.bits = 4;
  pw.block = o.gather_block;
  return pw;
}

// A table (or a MatMul weight that is also a table) stays in the output as float only when a
// node other than the planned Gathers and MatMuls, or a graph output, reads it.
void mark_float_readers(const onnx::GraphProto& g, Plan& plan) {
  std::unordered_map<std::string, int> uses, planned;
  for (const auto& n : g.node())
    for (const auto& in : n.input()) ++uses[in];
  for (const auto& o : g.output()) uses[o.name()] += 1 << 20;
  for (const auto* list : {&plan.weights, &plan.gathers})
    for (const auto& pw : *list) planned[pw.weight] += int(pw.nodes.size());
  for (auto* list : {&plan.weights, &plan.gathers})
    for (auto& pw : *list) pw.keep_float = uses[pw.weight] > planned[pw.weight];
}

}  // namespace

void plan_gathers(const OnnxModel& model, const PlanOptions& options, const Excludes& excludes, Plan& plan) {
  const auto& g = model.proto().graph();
  std::unordered_map<std::string, size_t> by_table;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    if (!is_table_gather(model, n)) continue;
    const std::string why = why_not(model, n, excludes);
    if (!why.empty()) {
      plan.skipped.push_back({n.name(), n.op_type(), why});
      continue;
    }
    auto it = by_table.find(n.input(0));
    if (it != by_table.end()) {
      plan.gathers[it->second].nodes.push_back(i);
      continue;
    }
    by_table.emplace(n.input(0), plan.gathers.size());
    plan.gathers.push_back(planned_table(n, i, *model.initializer(n.input(0)), options));
  }
  mark_float_readers(g, plan);
}

namespace {

// Whether the [K, N] data of `w` is the transpose of the [V, H] table `t` (same dtype), element by element.
bool is_transpose(OnnxModel& model, const PlannedWeight& t, const PlannedWeight& w) {
  if (w.k_axis != 0 || w.dtype != t.dtype || w.rows != t.cols || w.cols != t.rows) return false;
  const TensorView a = model.view(*model.initializer(t.weight)), b = model.view(*model.initializer(w.weight));
  const size_t es = dtype_size(t.dtype);
  for (int64_t v = 0; v < t.rows; ++v)
    for (int64_t h = 0; h < t.cols; ++h)
      if (std::memcmp(a.data + size_t(v * t.cols + h) * es, b.data + size_t(h * t.rows + v) * es, es) != 0)
        return false;
  return true;
}

}  // namespace

void find_tied_tables(OnnxModel& model, Plan& plan) {
  for (auto& t : plan.gathers)
    for (const auto& w : plan.weights) {
      const bool same = w.weight == t.weight && w.k_axis == t.k_axis;
      if (same || (t.k_axis == 1 && is_transpose(model, t, w))) {
        t.tied_to = w.weight;
        break;
      }
    }
}

void note_float_gathers(const OnnxModel& model, Plan& plan) {
  for (const auto& n : model.proto().graph().node()) {
    if (!is_table_gather(model, n)) continue;
    const onnx::TensorProto& t = *model.initializer(n.input(0));
    if (t.dims_size() == 2 && is_quantizable_float(static_cast<DType>(t.data_type())))
      plan.skipped.push_back({n.name(), n.op_type(), "embedding '" + t.name() + "' stays float (quantize it with "
                                                    "--gather_quantize_axis 1)"});
  }
}

}  // namespace nibble

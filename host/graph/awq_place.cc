#include "host/graph/awq_place.h"

#include <spdlog/spdlog.h>

#include <set>

#include "host/graph/rewrite.h"
#include "loaders/error.h"

namespace nibble {
namespace {


// A constant divided by s along the axis of length K = s.size(), as numpy's tensor / pre_quant_scale
// in the weight dtype: a [.., K] vector or a [R, K] matrix (columns), or a [K, C] matrix (rows, a
// Gemm transB weight). The division runs on the backend (divide_columns: K is its N axis).
std::vector<uint8_t> divide(OnnxModel& model, kernels::Backend& backend, const onnx::TensorProto& t,
                            const std::vector<float>& s, bool rows) {
  TensorView v = model.view(t);
  const int64_t K = int64_t(s.size()), other = K ? v.numel / K : 0;
  const kernels::WeightMatrix w{v.dtype, v.data, rows ? K : other, rows ? other : K, rows ? 1 : 0, {}};
  return backend.divide_columns(w, s.data());
}

bool is_float_const(const onnx::TensorProto* t) {
  return t && is_quantizable_float(static_cast<DType>(t->data_type()));
}

std::vector<float> inverse(const std::vector<float>& s, DType dt) {
  std::vector<float> inv(s.size());
  for (size_t k = 0; k < s.size(); ++k) inv[k] = round_to(dt, 1.0f / round_to(dt, s[k]));
  return inv;
}

// Folds 1/s of one activation into its producer node where that is exact.
class Folder {
 public:
  Folder(OnnxModel& model, const Plan& plan, GraphRewriter& rw, kernels::Backend& backend,
         std::map<std::string, std::vector<float>>& column_divisors)
      : model_(model), g_(model.proto().graph()), rw_(rw), backend_(backend), column_divisors_(column_divisors) {
    for (int i = 0; i < g_.node_size(); ++i) {
      for (const auto& o : g_.node(i).output()) producer_[o] = i;
      for (const auto& in : g_.node(i).input()) ++readers_[in];
    }
    for (const auto& o : g_.output()) ++readers_[o.name()];
    for (const auto& pw : plan.weights) planned_.insert(pw.weight);
  }

  // The node producing `act`, or null for a graph input.
  const onnx::NodeProto* producer(const std::string& act) const {
    auto it = producer_.find(act);
    return it == producer_.end() ? nullptr : &g_.node(it->second);
  }

  // Whether 1/s was folded into p; *why says why not otherwise.
  bool fold(const onnx::NodeProto& p, const std::string& act, size_t consumers, const std::vector<float>& s,
            std::string* why) {
    *why = "producer " + p.op_type() + " '" + p.name() + "' cannot absorb it";
    if (readers_[act] != int(consumers)) {
      *why = "'" + act + "' has other readers";
      return false;
    }
    if (p.output_size() == 0 || p.output(0) != act) return false;
    const std::string& op = p.op_type();
    if (op == "SimplifiedLayerNormalization" || op == "SkipSimplifiedLayerNormalization" || op == "LayerNormalization" ||
        op == "SkipLayerNormalization")
      return fold_norm(p, s);
    if (op == "Mul") return fold_mul(p, s);
    if ((op == "MatMul" || op == "Gemm") && int_attr(p, "transA", 0) == 0) return fold_matmul(p, s);
    return false;
  }

 private:
  const onnx::TensorProto* init(const onnx::NodeProto& p, int i) const {
    return i < p.input_size() && !p.input(i).empty() ? model_.initializer(p.input(i)) : nullptr;
  }
  bool private_const(const onnx::TensorProto* t) { return t && readers_[t->name()] == 1; }
  bool is_vector_k(const onnx::TensorProto* t, int64_t K) {
    return is_float_const(t) && private_const(t) && t->dims_size() == 1 && t->dims(0) == K;
  }

  // gamma (and LayerNormalization's beta) scale the normalised output; a Skip bias does not.
  bool fold_norm(const onnx::NodeProto& p, const std::vector<float>& s) {
    const std::string& op = p.op_type();
    std::vector<int> targets = {op == "SimplifiedLayerNormalization" || op == "LayerNormalization" ? 1 : 2};
    if (op == "LayerNormalization") targets.push_back(2);
    if (op == "SkipLayerNormalization") targets.push_back(3);
    const int64_t K = int64_t(s.size());
    for (int t : targets)
      if (t < p.input_size() && !p.input(t).empty() && !is_vector_k(init(p, t), K)) return false;
    for (int t : targets)
      if (t < p.input_size() && !p.input(t).empty())
        rw_.set_initializer_data(init(p, t)->name(), divide(model_, backend_, *init(p, t), s, false));
    return true;
  }

  bool fold_mul(const onnx::NodeProto& p, const std::vector<float>& s) {
    const int64_t K = int64_t(s.size());
    for (int c = 0; c < 2; ++c) {
      const onnx::TensorProto* t = init(p, c);
      if (!is_float_const(t) || !private_const(t) || init(p, 1 - c)) continue;
      int64_t numel = 1;
      for (int d = 0; d < t->dims_size(); ++d) numel *= t->dims(d);
      if (numel == 1) {  // a scalar becomes a [K] vector c / s
        TensorView v = model_.view(*t);
        const DType dt = v.dtype;
        const float c0 = load_float(dt, v.data, 0);
        std::vector<uint8_t> bytes(size_t(K) * dtype_size(dt));
        for (int64_t k = 0; k < K; ++k)
          store_float(dt, bytes.data(), size_t(k), round_to(dt, c0 / round_to(dt, s[size_t(k)])));
        const std::vector<int64_t> dims = {K};
        rw_.set_initializer_data(t->name(), bytes, &dims);
        return true;
      }
      if (t->dims_size() >= 1 && t->dims(t->dims_size() - 1) == K && numel == K) {
        rw_.set_initializer_data(t->name(), divide(model_, backend_, *t, s, false));
        return true;
      }
    }
    return false;
  }

  // A MatMul/Gemm producer's weight columns (and bias): divided now, or, when that weight is itself
  // quantized, before it is (ModelOpt folds after quantizing, and loses the 1/s).
  bool fold_matmul(const onnx::NodeProto& p, const std::vector<float>& s) {
    const onnx::TensorProto* w = init(p, 1);
    if (init(p, 0) || !is_float_const(w) || !private_const(w) || w->dims_size() != 2) return false;
    const int64_t K = int64_t(s.size());
    const bool trans = p.op_type() == "Gemm" && int_attr(p, "transB", 0) != 0;
    const onnx::TensorProto* bias = init(p, 2);
    const bool has_bias = p.input_size() >= 3 && !p.input(2).empty();
    if ((has_bias && !is_vector_k(bias, K)) || (trans ? w->dims(0) : w->dims(1)) != K) return false;
    if (planned_.count(w->name())) column_divisors_[w->name()] = s;
    else rw_.set_initializer_data(w->name(), divide(model_, backend_, *w, s, trans));
    if (has_bias) rw_.set_initializer_data(bias->name(), divide(model_, backend_, *bias, s, false));
    return true;
  }

  OnnxModel& model_;
  const onnx::GraphProto& g_;
  GraphRewriter& rw_;
  kernels::Backend& backend_;
  std::map<std::string, std::vector<float>>& column_divisors_;
  std::map<std::string, int> producer_;  // tensor -> node index
  std::map<std::string, int> readers_;   // tensor -> number of reading inputs
  std::set<std::string> planned_;
};

}  // namespace

std::map<std::string, std::vector<float>> place_awq_scales(OnnxModel& model, const Plan& plan,
                                                           const std::map<std::string, std::vector<float>>& scales,
                                                           GraphRewriter& rw, kernels::Backend& backend,
                                                           bool fuse) {
  std::map<std::string, std::vector<float>> column_divisors;
  Folder folder(model, plan, rw, backend, column_divisors);
  auto per_weight_mul = [&](const PlannedWeight& pw) {
    rw.insert_scale_mul(pw.activation, pw.nodes, pw.dtype, inverse(scales.at(pw.weight), pw.dtype),
                        pw.weight + "_PQS", pw.weight + "_awq_scale", pw.weight + "_PQS_Tensor");
  };
  for (const auto& [act, idx] : plan.siblings) {
    const onnx::NodeProto* p = folder.producer(act);
    if (!fuse || !p) {  // a graph input: ModelOpt gives each weight its own Mul
      for (size_t i : idx) per_weight_mul(plan.weights[i]);
      continue;
    }
    const PlannedWeight& first = plan.weights[idx[0]];
    const std::vector<float>& s = scales.at(first.weight);
    std::vector<int> consumers;
    for (size_t i : idx) consumers.insert(consumers.end(), plan.weights[i].nodes.begin(), plan.weights[i].nodes.end());
    std::string why;
    if (folder.fold(*p, act, consumers.size(), s, &why)) {
      spdlog::debug("awq: 1/s of '{}' folded into {} '{}'", act, p->op_type(), p->name());
      continue;
    }
    spdlog::debug("awq: 1/s of '{}' as a Mul ({})", act, why);
    rw.insert_scale_mul(act, consumers, first.dtype, inverse(s, first.dtype), act + "_pre_quant_scale_mul",
                        act + "_pre_quant_scale", act + "_pre_quant_scale_out");
  }
  return column_divisors;
}

}  // namespace nibble

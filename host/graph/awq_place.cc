#include "host/graph/awq_place.h"

#include <spdlog/spdlog.h>

#include <set>

#include "host/graph/rewrite.h"
#include "loaders/error.h"

namespace nibble {
namespace {


// Divides a constant by s along one axis: `axis_len` consecutive... generic over a [outer, K, inner] view.
std::vector<uint8_t> divide(OnnxModel& model, const onnx::TensorProto& t, const std::vector<float>& s,
                            int64_t outer, int64_t inner) {
  TensorView v = model.view(t);
  const DType dt = v.dtype;
  const int64_t K = int64_t(s.size());
  std::vector<uint8_t> out(size_t(v.numel) * dtype_size(dt));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t i = 0; i < inner; ++i) {
        const size_t idx = size_t((o * K + k) * inner + i);
        // numpy: tensor / pre_quant_scale, both in the weight dtype
        store_float(dt, out.data(), idx, round_to(dt, load_float(dt, v.data, idx) / round_to(dt, s[size_t(k)])));
      }
  return out;
}

bool is_float_const(const onnx::TensorProto* t) {
  return t && is_quantizable_float(static_cast<DType>(t->data_type()));
}

}  // namespace

std::map<std::string, std::vector<float>> place_awq_scales(OnnxModel& model, const Plan& plan,
                                                           const std::map<std::string, std::vector<float>>& scales,
                                                           GraphRewriter& rw, bool fuse) {
  std::map<std::string, std::vector<float>> column_divisors;
  const auto& g = model.proto().graph();
  std::map<std::string, int> producer;  // tensor -> node index
  std::map<std::string, int> readers;   // tensor -> number of reading inputs
  for (int i = 0; i < g.node_size(); ++i) {
    for (const auto& o : g.node(i).output()) producer[o] = i;
    for (const auto& in : g.node(i).input()) ++readers[in];
  }
  for (const auto& o : g.output()) ++readers[o.name()];
  std::map<std::string, const PlannedWeight*> planned;
  for (const auto& pw : plan.weights) planned[pw.weight] = &pw;

  auto inverse = [](const std::vector<float>& s, DType dt) {
    std::vector<float> inv(s.size());
    for (size_t k = 0; k < s.size(); ++k) inv[k] = round_to(dt, 1.0f / round_to(dt, s[k]));
    return inv;
  };
  auto per_weight_mul = [&](const PlannedWeight& pw) {
    rw.insert_scale_mul(pw.activation, pw.nodes, pw.dtype, inverse(scales.at(pw.weight), pw.dtype),
                        pw.weight + "_PQS", pw.weight + "_awq_scale", pw.weight + "_PQS_Tensor");
  };

  for (const auto& [act, idx] : plan.siblings) {
    const PlannedWeight& first = plan.weights[idx[0]];
    if (!fuse) {
      for (size_t i : idx) per_weight_mul(plan.weights[i]);
      continue;
    }
    const std::vector<float>& s = scales.at(first.weight);
    const int64_t K = int64_t(s.size());
    std::vector<int> consumers;
    for (size_t i : idx) consumers.insert(consumers.end(), plan.weights[i].nodes.begin(), plan.weights[i].nodes.end());
    auto pit = producer.find(act);
    if (pit == producer.end()) {  // a graph input: ModelOpt gives each weight its own Mul
      for (size_t i : idx) per_weight_mul(plan.weights[i]);
      continue;
    }
    const onnx::NodeProto& p = g.node(pit->second);
    const bool only_quantized_readers = readers[act] == int(consumers.size());
    const std::string op = p.op_type();
    auto init = [&](int i) -> const onnx::TensorProto* {
      return i < p.input_size() && !p.input(i).empty() ? model.initializer(p.input(i)) : nullptr;
    };
    auto private_const = [&](const onnx::TensorProto* t) { return t && readers[t->name()] == 1; };
    bool folded = false;
    std::string why = "producer " + op + " '" + p.name() + "' cannot absorb it";
    if (!only_quantized_readers) {
      why = "'" + act + "' has other readers";
    } else if (p.output_size() > 0 && p.output(0) == act) {
      if (op == "SimplifiedLayerNormalization" || op == "SkipSimplifiedLayerNormalization" ||
          op == "LayerNormalization" || op == "SkipLayerNormalization") {
        // gamma (and LayerNormalization's beta) scale the normalised output; a Skip bias does not.
        std::vector<int> targets;
        if (op == "SimplifiedLayerNormalization" || op == "LayerNormalization") targets = {1};
        else targets = {2};
        if (op == "LayerNormalization") targets.push_back(2);
        if (op == "SkipLayerNormalization") targets.push_back(3);
        bool ok = true;
        for (int t : targets)
          if (t < p.input_size() && !p.input(t).empty())
            ok = ok && is_float_const(init(t)) && private_const(init(t)) && init(t)->dims_size() == 1 &&
                 init(t)->dims(0) == K;
        if (ok) {
          for (int t : targets)
            if (t < p.input_size() && !p.input(t).empty())
              rw.set_initializer_data(init(t)->name(), divide(model, *init(t), s, 1, 1));
          folded = true;
        }
      } else if (op == "Mul") {
        for (int c = 0; c < 2 && !folded; ++c) {
          const onnx::TensorProto* t = init(c);
          if (!is_float_const(t) || !private_const(t) || init(1 - c)) continue;
          int64_t numel = 1;
          for (int d = 0; d < t->dims_size(); ++d) numel *= t->dims(d);
          if (numel == 1) {  // a scalar becomes a [K] vector c / s
            TensorView v = model.view(*t);
            const DType dt = v.dtype;
            const float c0 = load_float(dt, v.data, 0);
            std::vector<uint8_t> bytes(size_t(K) * dtype_size(dt));
            for (int64_t k = 0; k < K; ++k)
              store_float(dt, bytes.data(), size_t(k), round_to(dt, c0 / round_to(dt, s[size_t(k)])));
            const std::vector<int64_t> dims = {K};
            rw.set_initializer_data(t->name(), bytes, &dims);
            folded = true;
          } else if (t->dims_size() >= 1 && t->dims(t->dims_size() - 1) == K && numel == K) {
            rw.set_initializer_data(t->name(), divide(model, *t, s, 1, 1));
            folded = true;
          }
        }
      } else if ((op == "MatMul" || op == "Gemm") && !init(0) && is_float_const(init(1)) && private_const(init(1)) &&
                 init(1)->dims_size() == 2 && int_attr(p, "transA", 0) == 0) {
        const onnx::TensorProto* w = init(1);
        const bool trans = op == "Gemm" && int_attr(p, "transB", 0) != 0;
        const onnx::TensorProto* bias = init(2);
        const bool bias_ok = p.input_size() < 3 || p.input(2).empty() ||
                             (is_float_const(bias) && private_const(bias) && bias->dims_size() == 1 && bias->dims(0) == K);
        if (bias_ok && (trans ? w->dims(0) : w->dims(1)) == K) {
          auto pl = planned.find(w->name());
          if (pl != planned.end()) {
            column_divisors[w->name()] = s;  // applied before that weight is itself quantized
          } else {
            rw.set_initializer_data(w->name(), trans ? divide(model, *w, s, 1, w->dims(1)) : divide(model, *w, s, w->dims(0), 1));
          }
          if (bias && p.input_size() >= 3 && !p.input(2).empty())
            rw.set_initializer_data(bias->name(), divide(model, *bias, s, 1, 1));
          folded = true;
        }
      }
    }
    if (folded) {
      spdlog::debug("awq: 1/s of '{}' folded into {} '{}'", act, op, p.name());
      continue;
    }
    spdlog::debug("awq: 1/s of '{}' as a Mul ({})", act, why);
    rw.insert_scale_mul(act, consumers, first.dtype, inverse(s, first.dtype), act + "_pre_quant_scale_mul",
                        act + "_pre_quant_scale", act + "_pre_quant_scale_out");
  }
  return column_divisors;
}

}  // namespace nibble

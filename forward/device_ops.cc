#include "forward/device_ops.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "forward/op_table.h"

namespace nibble::forward {
namespace {

using kernels::Backend;
using kernels::ForwardBinary;
using kernels::ForwardUnary;
using kernels::Tensor;

// A device result of the graph's type `t`: `wide` where the operator leaves fp16/bf16 values unrounded.
Value device_value(DType t, std::vector<int64_t> shape, Tensor d, bool wide) {
  Value v;
  v.dtype = t;
  v.shape = std::move(shape);
  v.wide = wide && t != DType::kFloat32;
  v.device = std::move(d);
  v.device.shape = device_shape(v.shape);
  return v;
}

bool floats_on_device(const OpCall& c, std::initializer_list<size_t> inputs) {
  for (size_t i : inputs) {
    const Value* v = c.input(i);
    if (v && !(v->is_float() && v->on_device())) return false;
  }
  return true;
}

// A product of two activations with the same batch dims ([.., M, K] · [.., K, N]): one sgemm per batch
// element, as the host's MatMul makes them; a single one in the weight product's panels, as the host's.
bool batched_matmul(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  const Value& y = c.need(1);
  const size_t r = x.shape.size();
  if (r < 3 || y.shape.size() != r || !std::equal(x.shape.begin(), x.shape.end() - 2, y.shape.begin()) ||
      x.shape[r - 1] != y.shape[r - 2])
    return false;
  const int64_t batch = numel_of(std::vector<int64_t>(x.shape.begin(), x.shape.end() - 2));
  const int64_t M = x.shape[r - 2], K = x.shape[r - 1], N = y.shape[r - 1];
  const auto t0 = std::chrono::steady_clock::now();
  Tensor res;
  if (batch == 1) {
    Tensor w = y.device;
    w.shape = {K, N};
    res = b.forward_matmul(x.device, w, false);
  } else {
    res = b.forward_matmul_batched(x.device, y.device);
  }
  if (c.meter) {
    c.meter->flop += 2.0 * double(batch) * double(M) * double(K) * double(N);
    c.meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  auto shape = x.shape;
  shape.back() = N;
  out = {device_value(x.dtype, std::move(shape), std::move(res), c.float32_on_cpu)};
  return true;
}

bool matmul(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  const Value& w = c.need(1);
  if (!floats_on_device(c, {0, 1}) || x.shape.size() < 2) return false;
  if (w.shape.size() != 2) return batched_matmul(c, b, out);
  if (x.shape.back() != w.shape[0]) c.fail("shapes " + shape_text(x.shape) + " and " + shape_text(w.shape) + " do not multiply");
  const auto t0 = std::chrono::steady_clock::now();
  Tensor r = b.forward_matmul(x.device, w.device, false);
  auto shape = x.shape;
  shape.back() = w.shape[1];
  if (c.meter) {
    c.meter->flop += 2.0 * double(x.numel()) * double(w.shape[1]);
    c.meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  out = {device_value(x.dtype, std::move(shape), std::move(r), c.float32_on_cpu)};
  return true;
}

// The norms: inputs (x, gamma[, beta]) or, with a skip, (x, skip, gamma[, beta][, bias]).
bool norm(const OpCall& c, Backend& b, std::vector<Value>& out, bool rms, bool skip) {
  if (!floats_on_device(c, {0, 1, 2, 3, 4})) return false;
  const Value& x = c.need(0);
  kernels::NormArgs a;
  a.x = x.device;
  a.rms = rms;
  a.eps = c.float_attr("epsilon", 1e-5f);
  a.round = x.dtype;
  if (skip) {
    a.skip = c.need(1).device;
    a.gamma = c.need(2).device;
    if (!rms && c.input(3)) a.beta = c.input(3)->device;
    if (const Value* bias = c.input(rms ? 3 : 4)) a.bias = bias->device;
    a.width = x.shape.empty() ? 1 : x.shape.back();
    a.with_sum = c.node.output_size() > 3 && !c.node.output(3).empty();
  } else {
    a.gamma = c.need(1).device;
    if (!rms && c.input(2)) a.beta = c.input(2)->device;
    a.width = trailing_width(c, x);
  }
  if (a.gamma.elements() != a.width) c.fail("scale has " + std::to_string(a.gamma.elements()) + " values for rows of " + std::to_string(a.width));
  std::vector<Tensor> r = b.forward_norm(a);
  out = {device_value(x.dtype, x.shape, std::move(r[0]), false)};
  if (a.with_sum) {
    out.resize(4);
    out[3] = device_value(x.dtype, x.shape, std::move(r[1]), false);
  }
  return true;
}

bool attention(const OpCall& c, Backend& b, std::vector<Value>& out) {
  if (!floats_on_device(c, {0, 1, 2, 7, 8})) return false;
  kernels::AttentionArgs a;
  a.g = gqa_shape(c, a.keys);
  a.query = c.need(0).device;
  if (!a.g.packed) {
    a.key = c.need(1).device;
    a.value = c.need(2).device;
  }
  if (a.g.rot_half) {
    a.cos = c.need(7).device;
    a.sin = c.need(8).device;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> r = b.forward_attention(a);
  if (c.meter) {
    c.meter->flop += 4.0 * double(a.g.B * a.g.Hq) * double(a.g.S) * double(a.g.S) * double(a.g.D);
    c.meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const DType t = c.need(0).dtype;
  const auto& g = a.g;
  out = {device_value(t, {g.B, g.S, g.Hq * g.D}, std::move(r[0]), false),
         device_value(t, {g.B, g.Hkv, g.S, g.D}, std::move(r[1]), false),
         device_value(t, {g.B, g.Hkv, g.S, g.D}, std::move(r[2]), false)};
  return true;
}

// LpNormalization (p = 2) over the last axis.
bool lp_norm(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  if (!floats_on_device(c, {0}) || c.int_attr("p", 2) != 2 || x.shape.empty() ||
      size_t(normalize_axis(c, c.int_attr("axis", -1), x.shape.size())) + 1 != x.shape.size())
    return false;
  kernels::NormArgs a;
  a.x = x.device;
  a.l2 = true;
  a.width = x.shape.back();
  out = {device_value(x.dtype, x.shape, std::move(b.forward_norm(a)[0]), c.float32_on_cpu)};
  return true;
}

// Operators that relabel a value's shape, read only its shape, or move its elements through strided_copy or
// Cast (which do that on the device when the call has one): the host's operator on the device value.
bool host_form(const OpCall& c, Backend&, std::vector<Value>& out) {
  if (!floats_on_device(c, {0}) || !c.input(0)) return false;
  out = find_op(c.node.domain(), c.node.op_type())->fn(c);
  return true;
}

// Cast between float types (rounded on the device); to an integer type the host casts.
bool cast(const OpCall& c, Backend& b, std::vector<Value>& out) {
  return is_quantizable_float(DType(c.int_attr("to", 0))) && host_form(c, b, out);
}

// ReduceMean / ReduceSum of the last axis alone.
bool reduce(const OpCall& c, Backend& b, std::vector<Value>& out, bool mean) {
  const Value& x = c.need(0);
  const std::vector<int64_t> axes = c.input(1) ? to_ints(*c.input(1)) : c.ints_attr("axes");
  if (!floats_on_device(c, {0}) || x.shape.empty() || axes.size() != 1 ||
      size_t(normalize_axis(c, axes[0], x.shape.size())) + 1 != x.shape.size() || x.shape.back() == 0)
    return false;
  std::vector<int64_t> shape(x.shape.begin(), x.shape.end() - 1);
  if (c.int_attr("keepdims", 1)) shape.push_back(1);
  out = {device_value(x.dtype, shape, b.forward_reduce_rows(x.device, x.shape.back(), mean), c.float32_on_cpu)};
  return true;
}

// Softmax over the last axis (or one followed by axes of 1).
bool softmax(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  if (!floats_on_device(c, {0}) || x.shape.empty()) return false;
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", -1), x.shape.size()));
  for (size_t i = axis + 1; i < x.shape.size(); ++i)
    if (x.shape[i] != 1) return false;
  if (x.shape[axis] == 0) return false;
  out = {device_value(x.dtype, x.shape, b.forward_softmax_rows(x.device, x.shape[axis]), c.float32_on_cpu)};
  return true;
}

template <ForwardBinary kOp>
bool binary(const OpCall& c, Backend& b, std::vector<Value>& out) {
  if (!floats_on_device(c, {0, 1}) || !c.input(0) || !c.input(1)) return false;
  const Value& x = c.need(0);
  Tensor r = b.forward_binary(kOp, x.device, c.need(1).device);
  const auto shape = r.shape;
  out = {device_value(x.dtype, shape, std::move(r), c.float32_on_cpu)};
  return true;
}

template <ForwardUnary kOp>
bool unary(const OpCall& c, Backend& b, std::vector<Value>& out) {
  if (!floats_on_device(c, {0}) || c.input(1)) return false;  // FastGelu's bias: the host's
  const Value& x = c.need(0);
  out = {device_value(x.dtype, x.shape, b.forward_unary(kOp, x.device), c.float32_on_cpu)};
  return true;
}

bool gelu_onnx(const OpCall& c, Backend& b, std::vector<Value>& out) {
  for (const auto& a : c.node.attribute())
    if (a.name() == "approximate" && a.s() == "tanh") return unary<ForwardUnary::kGeluTanh>(c, b, out);
  return unary<ForwardUnary::kGeluErf>(c, b, out);
}

const std::map<std::string, DeviceOpFn>& device_table() {
  static const std::map<std::string, DeviceOpFn> t = {
      {":MatMul", matmul},
      {":SimplifiedLayerNormalization", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return norm(c, b, o, true, false); }},
      {"com.microsoft:SimplifiedLayerNormalization", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return norm(c, b, o, true, false); }},
      {":LayerNormalization", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return norm(c, b, o, false, false); }},
      {"com.microsoft:SkipSimplifiedLayerNormalization", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return norm(c, b, o, true, true); }},
      {"com.microsoft:SkipLayerNormalization", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return norm(c, b, o, false, true); }},
      {"com.microsoft:GroupQueryAttention", attention},
      {":LpNormalization", lp_norm},
      {":Reshape", host_form},
      {":Identity", host_form},
      {":Unsqueeze", host_form},
      {":Squeeze", host_form},
      {":Shape", host_form},
      {":Transpose", host_form},
      {":Split", host_form},
      {":Slice", host_form},
      {":Expand", host_form},
      {":Cast", cast},
      {":ReduceMean", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return reduce(c, b, o, true); }},
      {":ReduceSum", [](const OpCall& c, Backend& b, std::vector<Value>& o) { return reduce(c, b, o, false); }},
      {":Softmax", softmax},
      {":Add", binary<ForwardBinary::kAdd>},
      {":Sub", binary<ForwardBinary::kSub>},
      {":Mul", binary<ForwardBinary::kMul>},
      {":Div", binary<ForwardBinary::kDiv>},
      {":Pow", binary<ForwardBinary::kPow>},
      {":Sigmoid", unary<ForwardUnary::kSigmoid>},
      {":Exp", unary<ForwardUnary::kExp>},
      {":Sqrt", unary<ForwardUnary::kSqrt>},
      {":Reciprocal", unary<ForwardUnary::kReciprocal>},
      {":Neg", unary<ForwardUnary::kNeg>},
      {":Tanh", unary<ForwardUnary::kTanh>},
      {":Erf", unary<ForwardUnary::kErf>},
      {":Relu", unary<ForwardUnary::kRelu>},
      {":Gelu", gelu_onnx},
      {"com.microsoft:Gelu", unary<ForwardUnary::kGeluErf>},
      {"com.microsoft:FastGelu", unary<ForwardUnary::kGeluTanh>},
  };
  return t;
}

}  // namespace

DeviceOpFn find_device_op(const std::string& domain, const std::string& op_type) {
  const auto& t = device_table();
  const auto it = t.find((domain == "ai.onnx" ? "" : domain) + ":" + op_type);
  return it == t.end() ? nullptr : it->second;
}

}  // namespace nibble::forward

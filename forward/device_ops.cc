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
  v.device.shape = v.shape;
  return v;
}

bool floats_on_device(const OpCall& c, std::initializer_list<size_t> inputs) {
  for (size_t i : inputs) {
    const Value* v = c.input(i);
    if (v && !(v->is_float() && v->on_device())) return false;
  }
  return true;
}

bool matmul(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  const Value& w = c.need(1);
  if (!floats_on_device(c, {0, 1}) || x.shape.size() < 2 || w.shape.size() != 2) return false;
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

// Operators that only relabel a value's shape (or read it): the host's operator, which reads no element,
// on the device value.
bool relabel(const OpCall& c, Backend&, std::vector<Value>& out) {
  if (!floats_on_device(c, {0}) || !c.input(0)) return false;
  out = find_op(c.node.domain(), c.node.op_type())->fn(c);
  return true;
}

// Split along the last axis: each part's columns.
bool split(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  if (!floats_on_device(c, {0}) || x.shape.empty() ||
      size_t(normalize_axis(c, c.int_attr("axis", 0), x.shape.size())) + 1 != x.shape.size())
    return false;
  const size_t n = size_t(c.node.output_size());
  std::vector<int64_t> sizes = c.input(1) ? to_ints(*c.input(1)) : c.ints_attr("split");
  const int64_t C = x.shape.back();
  if (sizes.empty())
    for (size_t i = 0; i < n; ++i) sizes.push_back(std::min((C + int64_t(n) - 1) / int64_t(n), C - (C + int64_t(n) - 1) / int64_t(n) * int64_t(i)));
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (sizes.size() != n || total != C) c.fail("the split sizes do not cover the last axis");
  out.clear();
  int64_t begin = 0;
  for (int64_t s : sizes) {
    Tensor part = b.forward_columns(x.device, begin, s);
    const auto shape = part.shape;
    out.push_back(device_value(x.dtype, shape, std::move(part), x.wide));
    begin += s;
  }
  return true;
}

// Slice of one axis, the last, with step 1 (Phi-3's gate and up cut from one product): its columns. The
// bounds are clamped as ONNX (and the host's Slice) clamps them.
bool slice(const OpCall& c, Backend& b, std::vector<Value>& out) {
  const Value& x = c.need(0);
  if (!floats_on_device(c, {0}) || x.shape.empty()) return false;
  const auto starts = to_ints(c.need(1)), ends = to_ints(c.need(2));
  const auto axes = c.input(3) ? to_ints(*c.input(3)) : std::vector<int64_t>{0};
  const auto steps = c.input(4) ? to_ints(*c.input(4)) : std::vector<int64_t>{1};
  if (starts.size() != 1 || ends.size() != 1 || axes.size() != 1 || steps.size() != 1 || steps[0] != 1 ||
      size_t(normalize_axis(c, axes[0], x.shape.size())) + 1 != x.shape.size())
    return false;
  const int64_t C = x.shape.back();
  auto clamp = [C](int64_t v) { return std::max<int64_t>(0, std::min<int64_t>(C, v < 0 ? v + C : v)); };
  const int64_t s = clamp(starts[0]), e = clamp(ends[0]);
  Tensor part = b.forward_columns(x.device, s, std::max<int64_t>(0, e - s));
  const auto shape = part.shape;
  out = {device_value(x.dtype, shape, std::move(part), x.wide)};
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
      {":Reshape", relabel},
      {":Identity", relabel},
      {":Unsqueeze", relabel},
      {":Squeeze", relabel},
      {":Shape", relabel},
      {":Split", split},
      {":Slice", slice},
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

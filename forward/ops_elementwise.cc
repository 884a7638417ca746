// Element-wise operators: float values are computed in float32 and each result rounded to the value's
// type (what ONNX Runtime's CPU kernels do for fp16, one operator at a time); integer values in int64.
#include <cmath>

#include "forward/broadcast.h"
#include "forward/fast_exp.h"
#include "forward/logistic_rows.h"
#include "forward/op_table.h"

namespace nibble::forward {

namespace {

enum class Binary { kAdd, kSub, kMul, kDiv, kPow };

float apply_float(Binary op, float a, float b) {
  switch (op) {
    case Binary::kAdd: return a + b;
    case Binary::kSub: return a - b;
    case Binary::kMul: return a * b;
    case Binary::kDiv: return a / b;
    case Binary::kPow: return b == 2.0f ? a * a : std::pow(a, b);
  }
  return 0.0f;
}

int64_t apply_int(const OpCall& c, Binary op, int64_t a, int64_t b) {
  switch (op) {
    case Binary::kAdd: return a + b;
    case Binary::kSub: return a - b;
    case Binary::kMul: return a * b;
    case Binary::kDiv:
      if (b == 0) c.fail("integer division by zero");
      return a / b;
    case Binary::kPow: return int64_t(std::pow(double(a), double(b)));
  }
  return 0;
}

// Two float32 operands: the operator fixed at compile time, so each loop vectorizes; operands of the
// output's shape (the MLP's gate times up, a residual add) in plain ranges.
template <Binary kOp>
void binary_f32(const std::vector<int64_t>& out_shape, const std::vector<int64_t> (&strides)[2], const float* x,
                const float* y, bool same_shapes, float* r) {
  if (same_shapes) {
    parallel_ranges(numel_of(out_shape), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) r[i] = apply_float(kOp, x[i], y[i]);
    });
    return;
  }
  parallel_broadcast(out_shape, strides, [&](int64_t i, int64_t ia, int64_t ib) { r[i] = apply_float(kOp, x[ia], y[ib]); });
}

void binary_f32(Binary op, const std::vector<int64_t>& out_shape, const std::vector<int64_t> (&strides)[2],
                const float* x, const float* y, bool same_shapes, float* r) {
  switch (op) {
    case Binary::kAdd: return binary_f32<Binary::kAdd>(out_shape, strides, x, y, same_shapes, r);
    case Binary::kSub: return binary_f32<Binary::kSub>(out_shape, strides, x, y, same_shapes, r);
    case Binary::kMul: return binary_f32<Binary::kMul>(out_shape, strides, x, y, same_shapes, r);
    case Binary::kDiv: return binary_f32<Binary::kDiv>(out_shape, strides, x, y, same_shapes, r);
    case Binary::kPow: return binary_f32<Binary::kPow>(out_shape, strides, x, y, same_shapes, r);
  }
}

// Operands of fp16 or float32 storage, one of them fp16 (an fp16 model's norm output times its weight):
// the operator and both loads fixed at compile time. Other element types: load_float per element.
template <Binary kOp>
void binary_mixed(const std::vector<int64_t>& out_shape, const std::vector<int64_t> (&strides)[2], const Value& a,
                  const Value& b, float* r) {
  const auto run = [&](auto load_a, auto load_b) {
    parallel_broadcast(out_shape, strides,
                       [&](int64_t i, int64_t ia, int64_t ib) { r[i] = apply_float(kOp, load_a(ia), load_b(ib)); });
  };
  const auto f32 = [](const Value& v) { return [x = v.as<float>()](int64_t i) { return x[i]; }; };
  const auto f16 = [](const Value& v) { return [x = v.as<uint16_t>()](int64_t i) { return half_to_float(x[i]); }; };
  const DType ta = a.storage(), tb = b.storage();
  if (ta == DType::kFloat16 && tb == DType::kFloat32) return run(f16(a), f32(b));
  if (ta == DType::kFloat32 && tb == DType::kFloat16) return run(f32(a), f16(b));
  if (ta == DType::kFloat16 && tb == DType::kFloat16) return run(f16(a), f16(b));
  parallel_broadcast(out_shape, strides, [&](int64_t i, int64_t ia, int64_t ib) {
    r[i] = apply_float(kOp, load_float(ta, a.data, size_t(ia)), load_float(tb, b.data, size_t(ib)));
  });
}

void binary_mixed(Binary op, const std::vector<int64_t>& out_shape, const std::vector<int64_t> (&strides)[2],
                  const Value& a, const Value& b, float* r) {
  switch (op) {
    case Binary::kAdd: return binary_mixed<Binary::kAdd>(out_shape, strides, a, b, r);
    case Binary::kSub: return binary_mixed<Binary::kSub>(out_shape, strides, a, b, r);
    case Binary::kMul: return binary_mixed<Binary::kMul>(out_shape, strides, a, b, r);
    case Binary::kDiv: return binary_mixed<Binary::kDiv>(out_shape, strides, a, b, r);
    case Binary::kPow: return binary_mixed<Binary::kPow>(out_shape, strides, a, b, r);
  }
}

std::vector<Value> binary(const OpCall& c, Binary op) {
  const Value& a = c.need(0);
  const Value& b = c.need(1);
  const auto out_shape = broadcast_shape(c, {a.shape, b.shape});
  const std::vector<int64_t> strides[2] = {broadcast_strides(a.shape, out_shape),
                                           broadcast_strides(b.shape, out_shape)};
  if (a.is_float()) {
    if (!b.is_float()) c.fail("a float and an integer operand");
    // An operand the result may overwrite (each output element reads that operand's element at its own
    // index only), else fresh elements.
    size_t reused = 0;
    float* in_place = c.reusable_floats(reused, out_shape, a.dtype);
    if (!in_place) in_place = c.reusable_floats(reused = 1, out_shape, a.dtype);
    Floats fresh(in_place ? 0 : static_cast<size_t>(numel_of(out_shape)));
    float* r = in_place ? in_place : fresh.data();
    const DType ta = a.storage(), tb = b.storage();
    if (ta == DType::kFloat32 && tb == DType::kFloat32) {
      binary_f32(op, out_shape, strides, a.as<float>(), b.as<float>(), a.shape == out_shape && b.shape == out_shape, r);
    } else {
      binary_mixed(op, out_shape, strides, a, b, r);
    }
    if (in_place) return {c.result_in(reused, a.dtype, out_shape)};
    return {c.result(a.dtype, out_shape, std::move(fresh))};
  }
  const auto x = to_ints(a);
  const auto y = to_ints(b);
  std::vector<int64_t> r(static_cast<size_t>(numel_of(out_shape)));
  for_each_broadcast(out_shape, strides,
                     [&](int64_t i, int64_t ia, int64_t ib) { r[size_t(i)] = apply_int(c, op, x[size_t(ia)], y[size_t(ib)]); });
  return {from_ints(a.dtype, out_shape, r)};
}

// f(in, out, n) over ranges of the elements; a float32 input is read where it is (no copy first).
template <class F>
std::vector<Value> unary_rows(const OpCall& c, F f) {
  const Value& a = c.need(0);
  if (!a.is_float()) c.fail("expects a float input, got " + dtype_name(a.dtype));
  Floats x;
  const float* in = a.as<float>();
  float* out = c.reusable_floats(0, a.shape, a.dtype);  // in place where the input may be overwritten
  const bool in_place = out != nullptr;
  if (!in_place && a.storage() == DType::kFloat32) {
    x.resize(size_t(a.numel()));
  } else if (!in_place) {
    x = to_floats(a);
    in = x.data();
  }
  if (!in_place) out = x.data();
  parallel_ranges(a.numel(), [&](int64_t begin, int64_t end) { f(in + begin, out + begin, end - begin); });
  if (in_place) return {c.result_in(0, a.dtype, a.shape)};
  return {c.result(a.dtype, a.shape, std::move(x))};
}

// f(x) element by element.
template <class F>
std::vector<Value> unary(const OpCall& c, F f) {
  return unary_rows(c, [&f](const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]);
  });
}
float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * float(M_SQRT1_2))); }
float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

// A wide fp16/bf16 value cast to float32: each element rounded to the value's type (ONNX Runtime's Cast
// before this one) and kept in float32, in one pass, into the value's own bytes where they may be reused.
Value rounded_to_float32(const OpCall& c, const Value& a) {
  float* out = c.reusable_floats(0, a.shape, DType::kFloat32);
  Floats fresh(out ? 0 : size_t(a.numel()));
  float* r = out ? out : fresh.data();
  const float* x = a.as<float>();
  const DType t = a.dtype;
  parallel_ranges(a.numel(), [&](int64_t begin, int64_t end) {
    if (t == DType::kFloat16)
      for (int64_t i = begin; i < end; ++i) r[i] = round_to_half(x[i]);
    else
      for (int64_t i = begin; i < end; ++i) r[i] = round_to_bf16(x[i]);
  });
  if (out) return c.result_in(0, DType::kFloat32, a.shape);
  return from_floats(DType::kFloat32, a.shape, std::move(fresh));
}

std::vector<Value> cast(const OpCall& c) {
  const Value& in = c.need(0);
  const DType to = DType(c.int_attr("to", 0));
  if (in.wide && !in.on_device() && to == DType::kFloat32) return {rounded_to_float32(c, in)};
  const Value a = in.wide && !in.on_device() ? narrow(in) : in;  // rounds_wide_inputs: rounded here
  if (to == a.dtype) return {a};
  if (a.on_device() && c.device && a.is_float() && is_quantizable_float(to)) {  // rounded where it is
    Value v = a;
    v.dtype = to;
    v.wide = false;
    if (to != DType::kFloat32) v.device = c.device->forward_round(a.device, to);
    v.device.shape = device_shape(a.shape);
    return {v};
  }
  if (is_quantizable_float(to)) {
    if (a.is_float() && a.storage() == DType::kFloat32 && to != DType::kFloat32)  // rounded where it is
      return {rounded_value(to, a.shape, a.as<float>())};
    if (a.is_float()) return {from_floats(to, a.shape, to_floats(a))};
    const auto x = to_ints(a);
    Floats f(x.begin(), x.end());
    return {from_floats(to, a.shape, std::move(f))};
  }
  if (to == DType::kInt64 || to == DType::kInt32 || to == DType::kInt8 || to == DType::kUInt8 || to == DType::kBool) {
    if (!a.is_float()) return {from_ints(to, a.shape, to_ints(a))};
    const auto f = to_floats(a);
    std::vector<int64_t> x(f.size());
    for (size_t i = 0; i < f.size(); ++i) x[i] = to == DType::kBool ? f[i] != 0.0f : int64_t(f[i]);
    return {from_ints(to, a.shape, x)};
  }
  c.fail("cast to " + dtype_name(int(to)) + " is not supported");
}

// Gelu / FastGelu (com.microsoft): FastGelu's optional bias is added first.
std::vector<Value> gelu(const OpCall& c, bool fast) {
  const Value& a = c.need(0);
  Floats x = to_floats(a);
  if (const Value* bias = c.input(1)) {
    const auto b = to_floats(*bias);
    if (b.empty() || x.size() % b.size()) c.fail("bias of " + shape_text(bias->shape) + " does not divide the input");
    for (size_t i = 0; i < x.size(); ++i) x[i] += b[i % b.size()];
  }
  parallel_ranges(int64_t(x.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[size_t(i)] = fast ? gelu_tanh(x[size_t(i)]) : gelu_erf(x[size_t(i)]);
  });
  return {c.result(a.dtype, a.shape, std::move(x))};
}

}  // namespace

void add_elementwise_ops(OpTable& t) {
  t[":Add"] = {[](const OpCall& c) { return binary(c, Binary::kAdd); }, true};
  t[":Sub"] = {[](const OpCall& c) { return binary(c, Binary::kSub); }, true};
  t[":Mul"] = {[](const OpCall& c) { return binary(c, Binary::kMul); }, true};
  t[":Div"] = {[](const OpCall& c) { return binary(c, Binary::kDiv); }, true};
  t[":Pow"] = {[](const OpCall& c) { return binary(c, Binary::kPow); }, true};
  t[":Sqrt"] = {[](const OpCall& c) { return unary(c, [](float x) { return std::sqrt(x); }); }, true};
  t[":Reciprocal"] = {[](const OpCall& c) { return unary(c, [](float x) { return 1.0f / x; }); }, true};
  t[":Neg"] = {[](const OpCall& c) { return unary(c, [](float x) { return -x; }); }, true};
  t[":Exp"] = {[](const OpCall& c) {
    return unary_rows(c, [](const float* in, float* out, int64_t n) { exp_rows(in, out, n, 0.0f); });
  }, true};
  t[":Tanh"] = {[](const OpCall& c) { return unary(c, [](float x) { return std::tanh(x); }); }, true};
  t[":Erf"] = {[](const OpCall& c) { return unary(c, [](float x) { return std::erf(x); }); }, true};
  t[":Relu"] = {[](const OpCall& c) { return unary(c, [](float x) { return x > 0.0f ? x : 0.0f; }); }, true};
  t[":Sigmoid"] = {[](const OpCall& c) { return unary_rows(c, logistic_rows); }, true};
  t[":Cast"] = {cast, false, true};
  t[":Gelu"] = {[](const OpCall& c) {  // opset 20: approximate = "none" | "tanh"
    for (const auto& a : c.node.attribute())
      if (a.name() == "approximate" && a.s() == "tanh") return gelu(c, true);
    return gelu(c, false);
  }, true};
  t["com.microsoft:Gelu"] = {[](const OpCall& c) { return gelu(c, false); }, true};
  t["com.microsoft:FastGelu"] = {[](const OpCall& c) { return gelu(c, true); }, true};
}

}  // namespace nibble::forward

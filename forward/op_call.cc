#include "forward/op_call.h"

#include "loaders/error.h"

namespace nibble::forward {

namespace {
const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
}  // namespace

const Value& OpCall::need(size_t i) const {
  const Value* v = input(i);
  if (!v) fail("input " + std::to_string(i) + " is missing");
  return *v;
}

int64_t OpCall::int_attr(const std::string& name, int64_t dflt) const {
  const auto* a = find_attr(node, name);
  return a ? a->i() : dflt;
}

float OpCall::float_attr(const std::string& name, float dflt) const {
  const auto* a = find_attr(node, name);
  return a ? a->f() : dflt;
}

std::vector<int64_t> OpCall::ints_attr(const std::string& name) const {
  const auto* a = find_attr(node, name);
  if (!a) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

bool OpCall::has_attr(const std::string& name) const { return find_attr(node, name) != nullptr; }

const onnx::TensorProto* OpCall::tensor_attr(const std::string& name) const {
  const auto* a = find_attr(node, name);
  return a && a->has_t() ? &a->t() : nullptr;
}

float* OpCall::reusable_floats(size_t i, const std::vector<int64_t>& shape, DType dtype) const {
  const Value* v = input(i);
  if (i >= reusable.size() || !reusable[i] || !v || !v->writable || v->on_device() || v->shape != shape ||
      v->storage() != DType::kFloat32 || !(dtype == DType::kFloat32 || float32_on_cpu))
    return nullptr;
  return static_cast<float*>(const_cast<void*>(v->data));
}

Value OpCall::result_in(size_t i, DType dtype, std::vector<int64_t> shape) const {
  const Value& v = need(i);
  return Value{dtype, std::move(shape), v.data, v.hold, dtype != DType::kFloat32, {}, true};
}

void OpCall::fail(const std::string& what) const {
  throw Error("forward: " + node.op_type() + " node '" + node.name() + "': " + what);
}

int64_t normalize_axis(const OpCall& c, int64_t axis, size_t rank) {
  const int64_t r = int64_t(rank);
  if (axis < -r || axis >= r)
    c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  return axis < 0 ? axis + r : axis;
}

int64_t trailing_width(const OpCall& c, const Value& x) {
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", -1), x.shape.size()));
  int64_t w = 1;
  for (size_t i = axis; i < x.shape.size(); ++i) w *= x.shape[i];
  return w;
}

}  // namespace nibble::forward

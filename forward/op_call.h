// One node as an operator sees it: its attributes and its input values (null where an optional input is
// omitted), and the registry of operators by ONNX domain and type (op_table.cc).
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <functional>
#include <string>
#include <vector>

#include "forward/matmul.h"
#include "forward/value.h"
#include "kernels/backend.h"

namespace nibble::forward {

struct OpCall {
  const onnx::NodeProto& node;
  std::vector<const Value*> in;
  bool float32_on_cpu = false;  // the operator's entry: results of fp16/bf16 type stay wide
  ProductMeter* meter = nullptr;  // the run's products, counted (matmul_counted)
  // The run's device backend when the node runs there (device_ops.h): an operator that moves elements
  // (strided_copy, Cast) then moves a device value's there.
  kernels::Backend* device = nullptr;
  // The run's buffer for the column panels of an fp16/bf16 weight widened for one product at a time
  // (matmul_widening): the same bytes each time instead of fresh pages.
  Floats* weight_scratch = nullptr;
  // Per input: the run lets this node overwrite its bytes (the node is the value's last reader, nothing
  // else holds them, they are the engine's own float32). Empty: none.
  std::vector<bool> reusable = {};

  // A float result: wide where the operator runs in float32 on ONNX Runtime's CPU provider, else rounded.
  Value result(DType dtype, std::vector<int64_t> shape, Floats values) const {
    return from_floats(dtype, std::move(shape), std::move(values), float32_on_cpu);
  }

  // Input i's float32 elements, to be overwritten by a result of `shape` and type `dtype` computed element
  // by element in place (element j read before j is written), where that is allowed: input i is reusable,
  // of that shape, and the result is stored in float32 (float32, or wide). Else null.
  float* reusable_floats(size_t i, const std::vector<int64_t>& shape, DType dtype) const;
  // The result that reusable_floats(i, shape, dtype) returned the elements of.
  Value result_in(size_t i, DType dtype, std::vector<int64_t> shape) const;

  // Input i, or null when the node omits it (an empty name or fewer inputs).
  const Value* input(size_t i) const { return i < in.size() ? in[i] : nullptr; }
  // Input i, which the operator needs: a one-line Error naming the node when it is missing.
  const Value& need(size_t i) const;
  int64_t int_attr(const std::string& name, int64_t dflt) const;
  float float_attr(const std::string& name, float dflt) const;
  std::vector<int64_t> ints_attr(const std::string& name) const;  // empty when absent
  bool has_attr(const std::string& name) const;
  const onnx::TensorProto* tensor_attr(const std::string& name) const;
  // A one-line Error "forward: <op> node '<name>': <what>".
  [[noreturn]] void fail(const std::string& what) const;
};

// An operator: the node's output values in order (an output the node does not name may be left empty).
using OpFn = std::function<std::vector<Value>(const OpCall&)>;

// float32_on_cpu: ONNX Runtime's CPU provider has no fp16 kernel for it and runs it in float32 between
// Casts it inserts (and drops between two such operators): its fp16 results are not rounded until an
// operator with an fp16 kernel reads them. The others get their inputs rounded (GraphRun does that).
// rounds_wide_inputs: the operator is given wide inputs as they are and rounds them itself (Cast: the
// rounding and the conversion in one pass over the elements instead of two).
struct OpEntry {
  OpFn fn;
  bool float32_on_cpu = false;
  bool rounds_wide_inputs = false;
};

// The operator for (domain, type), or null when the engine does not know it. "" and "ai.onnx" are the
// standard domain; ONNX Runtime's own operators are under "com.microsoft" (SimplifiedLayerNormalization,
// which ORT also registers in the standard domain, is found under both).
const OpEntry* find_op(const std::string& domain, const std::string& op_type);
// Every known operator as "domain:type", sorted (for messages and docs).
std::vector<std::string> known_ops();

// A negative axis counted from the end, checked against the rank.
int64_t normalize_axis(const OpCall& c, int64_t axis, size_t rank);
// The elements of x from the node's `axis` attribute (default -1) on: a norm's row width.
int64_t trailing_width(const OpCall& c, const Value& x);

}  // namespace nibble::forward

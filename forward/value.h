// The layer engine's values: what one ONNX tensor holds while the engine runs a graph. An element type,
// a shape, and bytes that are either the engine's own (an operator's result) or a view of memory that
// outlives the run (an initializer in the model's memory map, a feed the caller keeps).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "forward/buffer_pool.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace nibble::forward {

// `device`: a float value the run's device backend holds (GraphRun::use_backend): float32 values there (an
// fp16/bf16 value's rounded to its type unless `wide`), `data` null; the host reads it after a download.
// `wide`: an fp16/bf16 value held unrounded in float32 (the result of an operator ONNX Runtime's CPU
// provider runs in float32 between Casts it inserts: see graph_run.h); `dtype` stays the graph's type.
// `writable`: `hold` owns bytes the engine made (an operator's result), which the value's last reader may
// overwrite with its own result when nothing else holds them (OpCall::reusable_floats); never an
// initializer's or a feed's bytes.
struct Value {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::shared_ptr<const void> hold;  // keeps `data` alive where the value owns it
  bool wide = false;
  kernels::Tensor device;
  bool writable = false;

  int64_t numel() const;
  bool on_device() const { return !device.empty(); }
  DType storage() const { return wide ? DType::kFloat32 : dtype; }
  size_t bytes() const { return size_t(numel()) * dtype_size(storage()); }
  bool is_float() const { return is_quantizable_float(dtype); }
  bool present() const { return dtype != DType::kUndefined; }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

// A device tensor's shape for a value of `shape`: a scalar as one element (a tensor of no dims holds none).
inline std::vector<int64_t> device_shape(const std::vector<int64_t>& shape) {
  return shape.empty() ? std::vector<int64_t>{1} : shape;
}

// Elements of a shape (1 for a scalar).
int64_t numel_of(const std::vector<int64_t>& shape);

// A value of its own, zero-filled; *out points at its bytes for the operator to fill.
Value new_value(DType dtype, std::vector<int64_t> shape, void** out);
// The same, not zero-filled: for an operator that writes every element.
Value unfilled_value(DType dtype, std::vector<int64_t> shape, void** out);
// A value that views memory the caller keeps alive for the run.
Value view_value(DType dtype, std::vector<int64_t> shape, const void* data);

// The elements of a float value as float32 (fp16 and bf16 widened; float32 and wide values copied).
Floats to_floats(const Value& v);
// The same into `out` (resized; its memory reused where it is large enough).
void to_floats_into(const Value& v, Floats& out);
// A float value's elements as float32: where they lie when it is stored as float32 (float32, or wide),
// else widened into `keep` (resized; its memory reused where it is large enough). Null for a null value.
const float* float32_view(const Value* v, Floats& keep);
// The elements of a float value as its type holds them, in float32: to_floats(narrow(v)) in one pass (a
// wide value's elements rounded to its type where they lie, no fp16 copy between).
void rounded_floats_into(const Value& v, Floats& out);
// A float value of type `dtype` from float32 elements, each rounded to `dtype`; with `wide`, an fp16/bf16
// value keeps them unrounded in float32.
Value from_floats(DType dtype, std::vector<int64_t> shape, Floats values, bool wide = false);
// A float value of type `dtype` from the numel_of(shape) float32 elements at x, each rounded to `dtype`
// (read where they are: no copy first).
Value rounded_value(DType dtype, std::vector<int64_t> shape, const float* x);
// A wide value rounded to its type (what ONNX Runtime's inserted Cast does); any other value as it is.
Value narrow(const Value& v);
// The elements of an integer value (int64, int32, int8, uint8) as int64.
std::vector<int64_t> to_ints(const Value& v);
Value from_ints(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values);

// "[2, 3, 4]", for messages.
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace nibble::forward

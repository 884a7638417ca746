#include "forward/value.h"

#include <cstring>

#include "forward/broadcast.h"
#include "forward/half_rows.h"
#include "loaders/error.h"

namespace nibble::forward {

Value unfilled_value(DType dtype, std::vector<int64_t> shape, void** out) {
  Value v{dtype, std::move(shape), nullptr, {}, false, {}};
  const size_t n = v.bytes();
  void* p = pool_alloc(n);
  v.hold = std::shared_ptr<void>(p, [n](void* q) { pool_free(q, n); });
  v.data = p;
  v.writable = true;
  *out = p;
  return v;
}

namespace {

// fp16 / bf16 elements to float32 and back, over the worker threads: element by element, so the bits do
// not depend on the ranges (a 7B layer's activations are 10^7-10^8 elements per operator).
void widen(DType t, const uint16_t* h, float* out, int64_t n) {
  parallel_ranges(n, [&](int64_t begin, int64_t end) {  // one branch-free loop per type (vectorized)
    if (t == DType::kFloat16)
      halves_to_floats(h + begin, out + begin, end - begin);
    else
      for (int64_t i = begin; i < end; ++i) out[i] = bf16_to_float(h[i]);
  });
}

// Each element rounded to t (float_to_half rounds as round_to then stores exactly).
void round_into(DType t, const float* x, uint16_t* out, int64_t n) {
  parallel_ranges(n, [&](int64_t begin, int64_t end) {
    if (t == DType::kFloat16)
      floats_to_halves(x + begin, out + begin, end - begin);
    else
      for (int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(x[i]);
  });
}

}  // namespace

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Value::numel() const { return numel_of(shape); }

Value new_value(DType dtype, std::vector<int64_t> shape, void** out) {
  Value v{dtype, std::move(shape), nullptr, {}, false, {}};
  const size_t n = v.bytes();
  if (dtype_size(dtype) == 0) throw Error("forward: no storage for element type " + dtype_name(dtype));
  void* p = pool_alloc(n);
  std::memset(p, 0, n);
  v.hold = std::shared_ptr<void>(p, [n](void* q) { pool_free(q, n); });
  v.data = p;
  v.writable = true;
  *out = p;
  return v;
}

Value view_value(DType dtype, std::vector<int64_t> shape, const void* data) {
  return Value{dtype, std::move(shape), data, {}, false, {}};
}

Floats to_floats(const Value& v) {
  Floats out;
  to_floats_into(v, out);
  return out;
}

void to_floats_into(const Value& v, Floats& out) {
  if (!v.is_float()) throw Error("forward: expected a float tensor, got " + dtype_name(v.dtype));
  const int64_t n = v.numel();
  out.resize(static_cast<size_t>(n));
  if (v.storage() == DType::kFloat32) {
    if (n) std::memcpy(out.data(), v.data, size_t(n) * 4);
    return;
  }
  widen(v.dtype, static_cast<const uint16_t*>(v.data), out.data(), n);
}

const float* float32_view(const Value* v, Floats& keep) {
  if (!v) return nullptr;
  if (v->storage() == DType::kFloat32) return v->as<float>();
  to_floats_into(*v, keep);
  return keep.data();
}

void rounded_floats_into(const Value& v, Floats& out) {
  if (!v.wide) return to_floats_into(v, out);
  const int64_t n = v.numel();
  out.resize(static_cast<size_t>(n));
  const float* x = v.as<float>();
  float* r = out.data();
  const DType t = v.dtype;
  parallel_ranges(n, [&](int64_t begin, int64_t end) {
    if (t == DType::kFloat16)
      for (int64_t i = begin; i < end; ++i) r[i] = round_to_half(x[i]);
    else
      for (int64_t i = begin; i < end; ++i) r[i] = round_to_bf16(x[i]);
  });
}

Value rounded_value(DType dtype, std::vector<int64_t> shape, const float* x) {
  if (dtype == DType::kFloat32) {
    Floats f(x, x + numel_of(shape));
    return from_floats(dtype, std::move(shape), std::move(f));
  }
  void* p = nullptr;
  Value v = unfilled_value(dtype, std::move(shape), &p);
  round_into(dtype, x, static_cast<uint16_t*>(p), v.numel());
  return v;
}

Value from_floats(DType dtype, std::vector<int64_t> shape, Floats values, bool wide) {
  wide = wide && dtype != DType::kFloat32;
  if (dtype == DType::kFloat32 || wide) {  // the elements become the value's own: no copy
    if (int64_t(values.size()) != numel_of(shape)) throw Error("forward: " + std::to_string(values.size()) +
                                                               " elements for shape " + shape_text(shape));
    auto held = std::make_shared<Floats>(std::move(values));
    return Value{dtype, std::move(shape), held->data(), held, wide, {}, true};
  }
  if (int64_t(values.size()) != numel_of(shape)) throw Error("forward: " + std::to_string(values.size()) +
                                                             " elements for shape " + shape_text(shape));
  return rounded_value(dtype, std::move(shape), values.data());
}

Value narrow(const Value& v) { return v.wide ? rounded_value(v.dtype, v.shape, v.as<float>()) : v; }

std::vector<int64_t> to_ints(const Value& v) {
  const int64_t n = v.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (v.dtype) {
      case DType::kInt64: out[size_t(i)] = v.as<int64_t>()[i]; break;
      case DType::kInt32: out[size_t(i)] = v.as<int32_t>()[i]; break;
      case DType::kInt8: out[size_t(i)] = v.as<int8_t>()[i]; break;
      case DType::kUInt8: out[size_t(i)] = v.as<uint8_t>()[i]; break;
      case DType::kBool: out[size_t(i)] = v.as<uint8_t>()[i] != 0; break;
      default: throw Error("forward: expected an integer tensor, got " + dtype_name(v.dtype));
    }
  }
  return out;
}

Value from_ints(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  void* p = nullptr;
  Value v = new_value(dtype, std::move(shape), &p);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kInt64: static_cast<int64_t*>(p)[i] = values[i]; break;
      case DType::kInt32: static_cast<int32_t*>(p)[i] = int32_t(values[i]); break;
      case DType::kInt8: static_cast<int8_t*>(p)[i] = int8_t(values[i]); break;
      case DType::kUInt8: static_cast<uint8_t*>(p)[i] = uint8_t(values[i]); break;
      case DType::kBool: static_cast<uint8_t*>(p)[i] = values[i] != 0; break;
      default: throw Error("forward: no integer storage for " + dtype_name(dtype));
    }
  }
  return v;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace nibble::forward

#include "forward/constant.h"

#include <cstring>

#include "loaders/error.h"

namespace nibble::forward {

Value constant_value(const onnx::TensorProto& t) {
  const DType dtype = DType(t.data_type());
  if (dtype_size(dtype) == 0) throw Error("forward: constant '" + t.name() + "' of type " + dtype_name(t.data_type()));
  if (t.data_location() == onnx::TensorProto::EXTERNAL)
    throw Error("forward: constant '" + t.name() + "' keeps its data in an external file");
  std::vector<int64_t> shape(t.dims().begin(), t.dims().end());
  void* p = nullptr;
  Value v = new_value(dtype, shape, &p);
  const size_t n = size_t(v.numel());
  auto too_few = [&](size_t have) {
    if (have < n) throw Error("forward: constant '" + t.name() + "' holds " + std::to_string(have) + " of " + std::to_string(n) + " values");
  };
  if (t.has_raw_data()) {
    too_few(t.raw_data().size() / dtype_size(dtype));
    std::memcpy(p, t.raw_data().data(), v.bytes());
  } else if (dtype == DType::kFloat32) {
    too_few(size_t(t.float_data_size()));
    std::memcpy(p, t.float_data().data(), v.bytes());
  } else if (dtype == DType::kInt64) {
    too_few(size_t(t.int64_data_size()));
    std::memcpy(p, t.int64_data().data(), v.bytes());
  } else if (dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kInt32 || dtype == DType::kInt8 ||
             dtype == DType::kUInt8) {
    too_few(size_t(t.int32_data_size()));
    for (size_t i = 0; i < n; ++i) {
      const int32_t x = t.int32_data(int(i));
      std::memcpy(static_cast<uint8_t*>(p) + i * dtype_size(dtype), &x, dtype_size(dtype));  // little-endian low bytes
    }
  } else {
    throw Error("forward: constant '" + t.name() + "' of type " + dtype_name(t.data_type()) + " in a typed field");
  }
  return v;
}

}  // namespace nibble::forward

#include "loaders/tensor_view.h"

#include <onnx/onnx-ml.pb.h>

#include <cerrno>
#include <cstdlib>

#include "loaders/error.h"

namespace nibble {

int64_t checked_numel(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int i = 0; i < t.dims_size(); ++i) {
    const int64_t d = t.dims(i);
    if (d < 0)
      throw Error("tensor '" + t.name() + "': dimension " + std::to_string(i) + " is negative (" +
                  std::to_string(d) + ")");
    if (__builtin_mul_overflow(n, d, &n))
      throw Error("tensor '" + t.name() + "': element count overflows 64 bits");
  }
  return n;
}

uint64_t expected_nbytes(const onnx::TensorProto& t) {
  const int64_t n = checked_numel(t);
  const DType dt = static_cast<DType>(t.data_type());
  if (dt == DType::kInt4 || dt == DType::kUInt4) return (uint64_t(n) + 1) / 2;
  const uint64_t es = dtype_size(dt);
  if (t.data_type() == 9) return uint64_t(n);  // bool
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(n), es, &bytes))
    throw Error("tensor '" + t.name() + "': byte size overflows 64 bits");
  return bytes;
}

static uint64_t parse_u64(const onnx::TensorProto& t, const std::string& key,
                          const std::string& value) {
  if (value.empty() || value[0] == '-' || value[0] == '+')
    throw Error("tensor '" + t.name() + "': external data " + key + " '" + value +
                "' is not a non-negative integer");
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (errno != 0 || end == value.c_str() || *end != '\0')
    throw Error("tensor '" + t.name() + "': external data " + key + " '" + value +
                "' is not a non-negative integer");
  return v;
}

ExternalRef parse_external_ref(const onnx::TensorProto& t) {
  ExternalRef ref;
  bool has_length = false;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") ref.location = kv.value();
    else if (kv.key() == "offset") ref.offset = parse_u64(t, "offset", kv.value());
    else if (kv.key() == "length") {
      ref.length = parse_u64(t, "length", kv.value());
      has_length = true;
    }
  }
  if (ref.location.empty())
    throw Error("tensor '" + t.name() + "': external data without a location");
  const uint64_t want = expected_nbytes(t);
  if (!has_length) ref.length = want;
  if (want != 0 && ref.length != want)
    throw Error("tensor '" + t.name() + "': external data length " + std::to_string(ref.length) +
                " does not match its shape and dtype (" + std::to_string(want) + " bytes)");
  return ref;
}

}  // namespace nibble

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

int onnx_element_bits(int data_type) {
  switch (data_type) {
    case 1: case 6: case 12: return 32;            // float, int32, uint32
    case 2: case 3: case 9: return 8;              // uint8, int8, bool
    case 4: case 5: case 10: case 16: return 16;   // uint16, int16, float16, bfloat16
    case 7: case 11: case 13: case 14: return 64;  // int64, double, uint64, complex64
    case 15: return 128;                           // complex128
    case 8: return 0;                              // string
    case 17: case 18: case 19: case 20: case 24: return 8;  // float8 variants
    case 21: case 22: case 23: return 4;           // uint4, int4, float4e2m1
    case 25: case 26: return 2;                    // uint2, int2
    default: return -1;
  }
}

uint64_t expected_nbytes(const onnx::TensorProto& t) {
  const int64_t n = checked_numel(t);
  const int bits = onnx_element_bits(t.data_type());
  if (bits < 0)
    throw Error("tensor '" + t.name() + "' has data_type " + std::to_string(t.data_type()) +
                (t.data_type() == 0 ? " (UNDEFINED)" : ", which is not an ONNX tensor type"));
  if (bits == 0) return 0;
  if (bits < 8) {
    const uint64_t per_byte = uint64_t(8 / bits);
    return (uint64_t(n) + per_byte - 1) / per_byte;
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(uint64_t(n), uint64_t(bits / 8), &bytes))
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
  if (onnx_element_bits(t.data_type()) != 0 && ref.length != want)
    throw Error("tensor '" + t.name() + "': external data length " + std::to_string(ref.length) +
                " does not match its shape and dtype (" + std::to_string(want) + " bytes)");
  return ref;
}

}  // namespace nibble

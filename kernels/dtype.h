// Element types nibble reads and writes, with the ONNX TensorProto.data_type numbers (the
// onnx 1.12 headers Debian ships predate INT4/UINT4, so the numbers live here), and reads, writes
// and roundings of float elements by type, through the one fp16/bf16 conversion (half_float.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/half_float.h"

namespace nibble {

enum class DType : int {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 9,  // one byte per element, 0 or 1 (the layer engine's conditions)
  kFloat16 = 10,
  kFloat64 = 11,
  kBFloat16 = 16,
  kUInt4 = 21,
  kInt4 = 22,
};

// Size in bytes of one element; 0 for the 4-bit types (two per byte) and unknown types.
size_t dtype_size(DType t);
// True for the float types nibble quantizes (fp32, fp16, bf16).
bool is_quantizable_float(DType t);
std::string dtype_name(DType t);
std::string dtype_name(int onnx_type);

// Rounds a float to the nearest value of type t (identity for fp32).
inline float round_to(DType t, float f) {
  if (t == DType::kFloat16) return round_to_half(f);
  if (t == DType::kBFloat16) return round_to_bf16(f);
  return f;
}

// Reads element i of a buffer of float type t as float.
inline float load_float(DType t, const void* p, size_t i) {
  if (t == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint16_t v = static_cast<const uint16_t*>(p)[i];
  return t == DType::kFloat16 ? half_to_float(v) : bf16_to_float(v);
}

// Writes a float (already representable in t) as element i of a buffer of type t.
inline void store_float(DType t, void* p, size_t i, float f) {
  if (t == DType::kFloat32) {
    static_cast<float*>(p)[i] = f;
  } else {
    static_cast<uint16_t*>(p)[i] = t == DType::kFloat16 ? float_to_half(f) : float_to_bf16(f);
  }
}

}  // namespace nibble

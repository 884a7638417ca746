// Element types nibble reads and writes, with the ONNX TensorProto.data_type numbers (the
// onnx 1.12 headers Debian ships predate INT4/UINT4, so the numbers live here), and the exact
// float <-> fp16/bf16 conversions every backend shares (round to nearest, ties to even).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <string>

namespace nibble {

enum class DType : int {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kInt32 = 6,
  kInt64 = 7,
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

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24 is exact in float
      float f = float(mant) * (1.0f / 16777216.0f);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Classic bit-exact float -> half, round to nearest even; subnormals through an exact scaling
// by 2^24 and nearbyint (the default rounding mode is to nearest even).
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                   // below 2^-14: subnormal half
    float af;
    std::memcpy(&af, &a, 4);
    return uint16_t(sign | uint16_t(std::nearbyint(af * 16777216.0f)));
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);  // rebias exponent by -112, round the 13 dropped bits
  return uint16_t(sign | (a >> 13));
}


inline float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// Rounds a float to the nearest value of type t (identity for fp32).
inline float round_to(DType t, float f) {
  if (t == DType::kFloat16) return half_to_float(float_to_half(f));
  if (t == DType::kBFloat16) return bf16_to_float(float_to_bf16(f));
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

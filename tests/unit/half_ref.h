// The plain reference of the fp16/bf16 conversions (kernels/half_float.h): IEEE 754 round to
// nearest even written the obvious way, with branches and nearbyint, and calling nothing of the
// product. The tests check the one implementation every backend shares against it.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace nibble::test {

inline float half_to_float_ref(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24 is exact in float
      const float f = float(mant) * (1.0f / 16777216.0f);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN with its payload
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Subnormal halves through an exact scaling by 2^24 and nearbyint (the default mode: nearest even).
inline uint16_t float_to_half_ref(float f) {
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

inline float bf16_to_float_ref(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline uint16_t float_to_bf16_ref(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

}  // namespace nibble::test

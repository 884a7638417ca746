// The one float <-> fp16/bf16 conversion nibble has: the dtype table (dtype.h), the CPU kernels and
// the CUDA kernels (NIBBLE_HD: host and device) all call these. Round to nearest, ties to even;
// subnormals, overflow to inf and NaN (quiet, sign kept) as IEEE 754 says. Written with selects
// on bits instead of branches and libm calls, so that a loop of them vectorizes (SSE2 by default,
// AVX2/AVX-512 in the dispatched clones of kernels/cpu/rtn_fast.cc) and a warp does not diverge.
// tests/unit/test_dtype.cc checks them against a plain branchy reference on every half and bf16
// and on a large sample of float patterns. No intrinsics on the host: portable C++.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define NIBBLE_HD __host__ __device__
#else
#define NIBBLE_HD
#endif

namespace nibble {

NIBBLE_HD inline uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
NIBBLE_HD inline float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
// c ? a : b on bits, as masks: no control flow for the vectorizer to give up on.
NIBBLE_HD inline uint32_t select_u32(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}

// Round half to even without a libm call: adding 1.5 * 2^23 leaves no fraction bits, so the FPU's
// default rounding does the work. rint_small is exact for |x| < 2^22 (callers that clamp to a code
// range afterwards may pass anything: a larger |x| clamps the same either way); rint_fast for any x.
constexpr float kRoundMagic = 12582912.0f;
NIBBLE_HD inline float rint_small(float x) { return (x + kRoundMagic) - kRoundMagic; }
NIBBLE_HD inline float rint_fast(float x) {
  return (x < 4194304.0f && x > -4194304.0f) ? rint_small(x) : x;
}

// Normals and inf/NaN by rebiasing the exponent; subnormals as (2^-14 * (1 + m/1024)) - 2^-14 =
// m * 2^-24, exact.
NIBBLE_HD inline float half_to_float(uint16_t h) {
  const uint32_t o = uint32_t(h & 0x7fffu) << 13;
  const uint32_t e = o & 0x0f800000u;
  uint32_t r = o + 0x38000000u;                          // exponent + (127 - 15)
  r = select_u32(e == 0x0f800000u, r + 0x38000000u, r);  // inf / NaN: exponent 255, payload kept
  r = select_u32(e == 0, r + 0x00800000u, r);            // subnormal: 2^-14 * (1 + m/1024)
  // Float arithmetic is done on every lane and only integer bits are selected: under the default
  // -ftrapping-math the compiler will not if-convert a float operation that sits in one arm.
  const uint32_t sub = f32_bits(bits_f32(r) - 6.103515625e-05f);
  r = select_u32(e == 0, sub, r);
  return bits_f32(r | (uint32_t(h & 0x8000u) << 16));
}

// Normals: rebias the exponent by -112 and round the 13 dropped bits to even in the integer add.
// Subnormal halves: |x| * 2^24 < 2^10 is exact, and adding 1.5 * 2^23 rounds it to an integer
// (nearest even, the default mode) that sits in the low mantissa bits.
NIBBLE_HD inline uint16_t float_to_half(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t sub = f32_bits(bits_f32(a) * 16777216.0f + kRoundMagic) - 0x4b400000u;
  uint32_t h = select_u32(a < 0x38800000u, sub, normal);
  h = select_u32(a >= 0x477ff000u, 0x7c00u, h);  // >= 65520 (and inf) rounds to inf
  h = select_u32(a > 0x7f800000u, 0x7e00u, h);   // NaN: quiet, no payload
  return uint16_t(h | sign);
}

NIBBLE_HD inline float bf16_to_float(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

NIBBLE_HD inline uint16_t float_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return uint16_t(select_u32((x & 0x7fffffffu) > 0x7f800000u, (x >> 16) | 0x40u, rounded));  // NaN: quiet
}

// half_to_float(float_to_half(f)) without leaving the float domain: the 13 dropped mantissa bits
// rounded away in place (a carry into the exponent is right), subnormals rounded at 2^-24.
NIBBLE_HD inline float round_to_half(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  const uint32_t sub = f32_bits(rint_small(bits_f32(a) * 16777216.0f) * 5.9604644775390625e-08f);
  uint32_t r = select_u32(a < 0x38800000u, sub, normal);
  r = select_u32(a >= 0x477ff000u, 0x7f800000u, r);
  r = select_u32(a > 0x7f800000u, 0x7fc00000u, r);
  return bits_f32(r | sign);
}

// bf16_to_float(float_to_bf16(f)) in one step.
NIBBLE_HD inline float round_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  const uint32_t nan = (x & 0xffff0000u) | 0x00400000u;
  return bits_f32(select_u32((x & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

}  // namespace nibble

// exp for the layer engine's Exp operator (softmax has ONNX Runtime's own: softmax_rows.h): a branch-free form (Cephes' expf: a degree-5
// polynomial on x − n·ln 2, scaled by 2^n through the exponent bits), four lanes at a time in GCC's vector
// types (a scalar loop with the clamps is not vectorized: GCC sees control flow), where each std::exp is a
// libm call. Within 2 ulp of exp (tests/unit/test_forward.cc measures the bound): ONNX Runtime's CPU
// kernels approximate exp too (MLAS), so neither side is libm's value and the engine's activations stay
// within the tolerance checked against ONNX Runtime's. The same lanes compute every element (a tail
// element goes through a vector of its own), so the bits do not depend on where a range starts.
#pragma once
#include <cstdint>
#include <cstring>

namespace nibble::forward {

typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

inline f32x4 exp_fast(f32x4 x) {
  // Outside [-87.3, 88.3] the result is clamped (1.2e-38 .. 2.2e38: 2^n stays within the exponent's
  // range); a softmax's or a sigmoid's sum does not see the difference from 0 or infinity. NaN stays NaN.
  const f32x4 lo = f32x4{} - 87.3f, hi = f32x4{} + 88.3f;
  f32x4 c = x > lo ? x : lo;
  c = c < hi ? c : hi;
  const f32x4 magic = f32x4{} + 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  const f32x4 n = (c * 1.44269504088896341f + magic) - magic;
  f32x4 r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  f32x4 p = f32x4{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f32x4 y = p * r * r + r + 1.0f;
  const i32x4 bits = (__builtin_convertvector(n, i32x4) + 127) << 23;
  f32x4 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x != x ? x : y * scale;
}

inline float exp_fast(float x) { return exp_fast(f32x4{x, x, x, x})[0]; }

// f over n elements in lanes of four: out[i] = f(in[i]) for an f of f32x4 (in may be out).
template <class F>
void map_lanes(const float* in, float* out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    f32x4 v;
    std::memcpy(&v, in + i, sizeof v);
    v = f(v);
    std::memcpy(out + i, &v, sizeof v);
  }
  for (; i < n; ++i) out[i] = f(f32x4{} + in[i])[0];
}

// out[i] = exp(in[i] − shift), a softmax row's numerators.
inline void exp_rows(const float* in, float* out, int64_t n, float shift) {
  map_lanes(in, out, n, [shift](f32x4 v) { return exp_fast(v - shift); });
}

}  // namespace nibble::forward

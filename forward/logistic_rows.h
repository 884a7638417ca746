// The logistic function over a run of elements with kernels/forward_math.h's `sigmoid` bits (ONNX Runtime's
// MLAS form: a rational function in fused multiply-adds): eight at a time where the CPU has FMA (and AVX2),
// the scalar function elsewhere. Sigmoid and SiLU read every element of a layer's MLP (10^7 per 7B batch).
#pragma once
#include <cstdint>

namespace nibble::forward {

// out[i] = sigmoid(in[i]) (in may be out).
void logistic_rows(const float* in, float* out, int64_t n);

}  // namespace nibble::forward

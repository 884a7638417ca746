// Softmax of a row in place with kernels/forward_math.h's softmax_mlas bits (ONNX Runtime's MLAS softmax:
// its exp, its sixteen-lane sum, times 1 / sum): sixteen elements at a time where the CPU has FMA (and
// AVX2), the scalar form elsewhere. GroupQueryAttention's scores and the Softmax operator run through it.
#pragma once
#include <cstdint>

namespace nibble::forward {

void softmax_row_mlas(float* row, int64_t n);

}  // namespace nibble::forward

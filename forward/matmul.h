// C[M, N] = A[M, K] · op(B) in float32, row-major, B [K, N] (or [N, K] when b_transposed): the one dense
// product of the engine. matmul_ref is the definition (each output a float32 sum in k order);
// matmul_blas is OpenBLAS's sgemm, the same products summed in its own order (tests/unit/test_forward.cc
// bounds the difference).
#pragma once
#include <cstdint>

namespace nibble::forward {

void matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed);
void matmul_blas(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed);

// The products a run computes, for the report's arithmetic rate: FLOPs (2·M·K·N each) and wall seconds.
struct ProductMeter {
  double flop = 0.0, seconds = 0.0;
};
// matmul_blas, counted in `meter` where it is non-null.
void matmul_counted(ProductMeter* meter, const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N,
                    bool b_transposed);

}  // namespace nibble::forward

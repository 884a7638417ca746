// The dense algebra the CUDA backend needs, as cuBLAS / cuSOLVER define it: column-major, pointers
// into device memory, the same arguments. Two implementations: cuBLAS + cuSOLVER on a GPU
// (cublas_linalg.cu) and OpenBLAS + LAPACK on the emulated device (blas_linalg.cc).
#pragma once
#include <memory>
#include <string>

#include "kernels/cuda/device.h"

namespace nibble::kernels::gpu {

enum class Op { kN, kT };
enum class Side { kLeft, kRight };
enum class Fill { kLower, kUpper };

class LinAlg {
 public:
  virtual ~LinAlg() = default;
  virtual std::string name() const = 0;
  // C = alpha op(A) op(B) + beta C; C is m x n, op(A) m x k.
  virtual void sgemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc) = 0;
  // `batch` independent sgemms, matrix i at A + i·sa, B + i·sb, C + i·sc (cublasSgemmStridedBatched).
  virtual void sgemm_strided_batched(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda,
                                     long long sa, const float* B, int ldb, long long sb, float beta, float* C, int ldc,
                                     long long sc, int batch) = 0;
  // C = alpha op(A) op(A)ᵀ + beta C on the `fill` triangle of the n x n C; op(A) is n x k.
  virtual void ssyrk(Fill fill, Op trans, int n, int k, float alpha, const float* A, int lda, float beta, float* C,
                     int ldc) = 0;
  // C = alpha op(A) B (left) or alpha B op(A) (right), A triangular (`fill`, non-unit diagonal), B and C
  // m x n. Out of place, as cuBLAS (BLAS's in-place form is C == B).
  virtual void strmm(Side side, Fill fill, Op ta, int m, int n, float alpha, const float* A, int lda, const float* B,
                     int ldb, float* C, int ldc) = 0;
  // Cholesky factor of the n x n symmetric positive definite A in place (`fill` triangle).
  // Returns LAPACK's info: 0 on success, i > 0 when the leading minor i is not positive.
  virtual int dpotrf(Fill fill, int n, double* A, int lda) = 0;
  // The inverse of A from its Cholesky factor (dpotrf's output) in place, on the same `fill` triangle.
  // Returns LAPACK's info: 0 on success, i > 0 when the factor's diagonal element i is zero.
  virtual int dpotri(Fill fill, int n, double* A, int lda) = 0;
};

// OpenBLAS + LAPACK on host memory (the emulated device's pointers are host pointers).
std::unique_ptr<LinAlg> make_blas_linalg();

}  // namespace nibble::kernels::gpu

#include "forward/matmul.h"

#include <chrono>

#include <cblas.h>

#include <climits>

#include "loaders/error.h"

namespace nibble::forward {

void matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += A[m * K + k] * (b_transposed ? B[n * K + k] : B[k * N + n]);
      C[m * N + n] = s;
    }
}

void matmul_blas(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed) {
  if (M > INT_MAX || K > INT_MAX || N > INT_MAX) throw Error("forward: a product too large for 32-bit BLAS indices");
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), 1.0f, A,
              int(K), B, b_transposed ? int(K) : int(N), 0.0f, C, int(N));
}

void matmul_counted(ProductMeter* meter, const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N,
                    bool b_transposed) {
  const auto t0 = std::chrono::steady_clock::now();
  matmul_blas(A, B, C, M, K, N, b_transposed);
  if (!meter) return;
  meter->flop += 2.0 * double(M) * double(K) * double(N);
  meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace nibble::forward

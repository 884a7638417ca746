// The linear-algebra interface on OpenBLAS and LAPACK: the emulated device's BLAS. The arguments are
// cuBLAS's, so the code that calls it is the code that runs on a GPU.
#include <cblas.h>

#include <algorithm>

#include "kernels/cuda/linalg.h"
#include "kernels/parallel.h"

extern "C" void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
extern "C" void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);

namespace nibble::kernels::gpu {
namespace {

CBLAS_TRANSPOSE op(Op o) { return o == Op::kN ? CblasNoTrans : CblasTrans; }
CBLAS_UPLO uplo(Fill f) { return f == Fill::kLower ? CblasLower : CblasUpper; }

class BlasLinAlg final : public LinAlg {
 public:
  BlasLinAlg() { openblas_set_num_threads(1); }  // the backend's own launches are the parallel part
  std::string name() const override { return "OpenBLAS"; }
  void sgemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) override {
    cblas_sgemm(CblasColMajor, op(ta), op(tb), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void sgemm_strided_batched(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, long long sa,
                             const float* B, int ldb, long long sb, float beta, float* C, int ldc, long long sc,
                             int batch) override {
    // The batch is the parallel part here, as it is on a GPU; each product is one single-threaded call.
    parallel_for(batch, [&](int64_t i) {
      cblas_sgemm(CblasColMajor, op(ta), op(tb), m, n, k, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc,
                  ldc);
    });
  }
  void ssyrk(Fill fill, Op trans, int n, int k, float alpha, const float* A, int lda, float beta, float* C,
             int ldc) override {
    cblas_ssyrk(CblasColMajor, uplo(fill), op(trans), n, k, alpha, A, lda, beta, C, ldc);
  }
  void strmm(Side side, Fill fill, Op ta, int m, int n, float alpha, const float* A, int lda, const float* B, int ldb,
             float* C, int ldc) override {
    if (C != B)
      for (int j = 0; j < n; ++j) std::copy(B + size_t(j) * size_t(ldb), B + size_t(j) * size_t(ldb) + m, C + size_t(j) * size_t(ldc));
    cblas_strmm(CblasColMajor, side == Side::kLeft ? CblasLeft : CblasRight, uplo(fill), op(ta), CblasNonUnit, m, n,
                alpha, A, lda, C, ldc);
  }
  int dpotrf(Fill fill, int n, double* A, int lda) override {
    const char u = fill == Fill::kLower ? 'L' : 'U';
    int info = 0;
    dpotrf_(&u, &n, A, &lda, &info);
    return info;
  }
  int dpotri(Fill fill, int n, double* A, int lda) override {
    const char u = fill == Fill::kLower ? 'L' : 'U';
    int info = 0;
    dpotri_(&u, &n, A, &lda, &info);
    return info;
  }
};

}  // namespace

std::unique_ptr<LinAlg> make_blas_linalg() { return std::make_unique<BlasLinAlg>(); }

}  // namespace nibble::kernels::gpu

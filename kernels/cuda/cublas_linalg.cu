// The linear-algebra interface on cuBLAS and cuSOLVER: one call each, the arguments unchanged.
// GPU builds only; blas_linalg.cc is its twin on the emulated device. Compiled, not yet run on a GPU.
#include <cublas_v2.h>
#include <cusolverDn.h>

#include <string>

#include "kernels/cuda/linalg.h"

namespace nibble::kernels::gpu {
namespace {

cublasOperation_t op(Op o) { return o == Op::kN ? CUBLAS_OP_N : CUBLAS_OP_T; }
cublasFillMode_t fill_mode(Fill f) { return f == Fill::kLower ? CUBLAS_FILL_MODE_LOWER : CUBLAS_FILL_MODE_UPPER; }

class CublasLinAlg final : public LinAlg {
 public:
  explicit CublasLinAlg(DeviceLayer& dev) : dev_(dev) {
    check(cublasCreate(&blas_), "create");
    // Plain fp32 arithmetic (no TF32 tensor cores): the losses must compare candidates finely.
    check(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH), "math mode");
    check(cusolverDnCreate(&solver_), "create");
    // On the device layer's compute stream, ordered with the kernels and the copies (device.h).
    auto* stream = static_cast<cudaStream_t>(dev_.compute_stream());
    check(cublasSetStream(blas_, stream), "set stream");
    check(cusolverDnSetStream(solver_, stream), "set stream");
  }
  ~CublasLinAlg() override {
    cusolverDnDestroy(solver_);
    cublasDestroy(blas_);
  }
  std::string name() const override { return "cuBLAS"; }
  void sgemm(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) override {
    check(cublasSgemm(blas_, op(ta), op(tb), m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc), "sgemm");
  }
  void sgemm_strided_batched(Op ta, Op tb, int m, int n, int k, float alpha, const float* A, int lda, long long sa,
                             const float* B, int ldb, long long sb, float beta, float* C, int ldc, long long sc,
                             int batch) override {
    check(cublasSgemmStridedBatched(blas_, op(ta), op(tb), m, n, k, &alpha, A, lda, sa, B, ldb, sb, &beta, C, ldc, sc,
                                    batch),
          "sgemm strided batched");
  }
  void ssyrk(Fill fill, Op trans, int n, int k, float alpha, const float* A, int lda, float beta, float* C,
             int ldc) override {
    check(cublasSsyrk(blas_, fill_mode(fill), op(trans), n, k, &alpha, A, lda, &beta, C, ldc), "ssyrk");
  }
  void strmm(Side side, Fill fill, Op ta, int m, int n, float alpha, const float* A, int lda, const float* B, int ldb,
             float* C, int ldc) override {
    check(cublasStrmm(blas_, side == Side::kLeft ? CUBLAS_SIDE_LEFT : CUBLAS_SIDE_RIGHT, fill_mode(fill), op(ta),
                      CUBLAS_DIAG_NON_UNIT, m, n, &alpha, A, lda, B, ldb, C, ldc),
          "strmm");
  }
  int dpotrf(Fill fill, int n, double* A, int lda) override {
    int work = 0;
    check(cusolverDnDpotrf_bufferSize(solver_, fill_mode(fill), n, A, lda, &work), "potrf buffer size");
    DeviceBuffer<double> ws(dev_, size_t(work));
    DeviceBuffer<int> info(dev_, 1);
    check(cusolverDnDpotrf(solver_, fill_mode(fill), n, A, lda, ws.get(), work, info.get()), "potrf");
    int h = 0;
    dev_.to_host(&h, info.get(), sizeof(int));
    return h;
  }
  int dpotri(Fill fill, int n, double* A, int lda) override {
    int work = 0;
    check(cusolverDnDpotri_bufferSize(solver_, fill_mode(fill), n, A, lda, &work), "potri buffer size");
    DeviceBuffer<double> ws(dev_, size_t(work));
    DeviceBuffer<int> info(dev_, 1);
    check(cusolverDnDpotri(solver_, fill_mode(fill), n, A, lda, ws.get(), work, info.get()), "potri");
    int h = 0;
    dev_.to_host(&h, info.get(), sizeof(int));
    return h;
  }

 private:
  // A failed call names the operation that made it: "cuda: awq_losses: cuBLAS sgemm: status 13".
  void check(cublasStatus_t s, const char* what) const {
    if (s != CUBLAS_STATUS_SUCCESS) dev_.fail(std::string("cuBLAS ") + what + ": status " + std::to_string(int(s)));
  }
  void check(cusolverStatus_t s, const char* what) const {
    if (s != CUSOLVER_STATUS_SUCCESS) dev_.fail(std::string("cuSOLVER ") + what + ": status " + std::to_string(int(s)));
  }

  DeviceLayer& dev_;
  cublasHandle_t blas_ = nullptr;
  cusolverDnHandle_t solver_ = nullptr;
};

}  // namespace

std::unique_ptr<LinAlg> make_cublas_linalg(DeviceLayer& dev) { return std::make_unique<CublasLinAlg>(dev); }

}  // namespace nibble::kernels::gpu

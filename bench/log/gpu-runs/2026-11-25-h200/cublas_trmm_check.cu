// Diagnostic: cublasStrmm (side right, lower, out-of-place and in-place) and cublasSgemm against a
// plain loop, on the shapes of the AWQ loss's factor form.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <vector>
#include <random>
static double run(int m, int k, int mode, bool stream) {
  std::mt19937 rng(1); std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> A(size_t(k) * k, 0.f), X(size_t(m) * k), Y(size_t(m) * k);
  for (int j = 0; j < k; ++j) for (int i = j; i < k; ++i) A[size_t(j) * k + i] = u(rng);  // lower, col-major
  for (auto& x : X) x = u(rng);
  float *dA, *dX, *dY; cudaMalloc(&dA, A.size() * 4); cudaMalloc(&dX, X.size() * 4); cudaMalloc(&dY, Y.size() * 4);
  cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice); cudaMemcpy(dX, X.data(), X.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dY, 0, Y.size() * 4);
  cublasHandle_t h; cublasCreate(&h); cudaStream_t s = nullptr;
  if (stream) { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); cublasSetStream(h, s); }
  float one = 1, zero = 0; cublasStatus_t st;
  if (mode == 0) st = cublasStrmm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, m, k, &one, dA, k, dX, m, dY, m);
  else if (mode == 1) st = cublasStrmm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, m, k, &one, dA, k, dX, m, dX, m);
  else st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, k, k, &one, dX, m, dA, k, &zero, dY, m);
  cudaDeviceSynchronize();
  cudaMemcpy(Y.data(), mode == 1 ? dX : dY, Y.size() * 4, cudaMemcpyDeviceToHost);
  double err = 0;
  for (int i = 0; i < m; ++i) for (int j = 0; j < k; ++j) {
    double w = 0; for (int p = j; p < k; ++p) w += double(X[size_t(p) * m + i]) * A[size_t(j) * k + p];
    err = std::fmax(err, std::fabs(w - Y[size_t(j) * m + i]));
  }
  if (st) std::printf("status %d ", int(st));
  cublasDestroy(h); cudaFree(dA); cudaFree(dX); cudaFree(dY);
  return err;
}
int main() {
  const char* names[] = {"strmm out-of-place", "strmm in-place", "sgemm"};
  for (auto [m, k] : {std::pair{2, 3}, {37, 200}, {64, 1100}, {64, 4096}})
    for (int mode = 0; mode < 3; ++mode)
      for (bool stream : {false, true})
        std::printf("m %d k %d %-20s stream %d: max abs error %.3g\n", m, k, names[mode], stream, run(m, k, mode, stream));
}

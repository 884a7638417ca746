// The CPU backend's forward operations (backend_ops.inc): the references (forward_ref.h), and the product
// as sgemm panels on the worker threads, the panels the layer engine's own product uses (forward/matmul.cc).
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/forward_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {

namespace {

// C[m, n] (ldc) = A[m, K] (lda) · op(B) (ldb), K in forward_k_slice slices, each sgemm added to the sum of
// the slices before it: the layer engine's products (forward/matmul.cc), slice for slice.
void sgemm_sliced(bool b_transposed, int64_t m, int64_t n, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* C, int64_t ldc, int64_t k_slice) {
  for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += k_slice) {
    const int64_t kk = std::min(k_slice, K - k0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, int(m), int(n), int(kk), 1.0f,
                A + k0, int(lda), b_transposed ? B + k0 : B + k0 * ldb, int(ldb), k0 ? 1.0f : 0.0f, C, int(ldc));
  }
}

}  // namespace

void forward_matmul_blas(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed) {
  if (M > INT_MAX || K > INT_MAX || N > INT_MAX) throw std::invalid_argument("forward_matmul: above 32-bit BLAS sizes");
  if (M == 0 || N == 0) return;
  openblas_set_num_threads(1);
  sgemm_sliced(b_transposed, M, N, K, A, K, B, b_transposed ? K : N, C, N, forward_k_slice(N, K, false));
}

void forward_matmul_sgemm(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N,
                          bool b_transposed) {
  if (M > INT_MAX || K > INT_MAX || N > INT_MAX) throw std::invalid_argument("forward_matmul: above 32-bit BLAS sizes");
  if (M == 0 || N == 0) return;
  openblas_set_num_threads(1);
  const int64_t rows = forward_panel_rows(M), cols = forward_panel_columns(N);
  const int64_t col_panels = (N + cols - 1) / cols;
  parallel_for((M + rows - 1) / rows * col_panels, [&](int64_t p) {
    const int64_t m0 = p / col_panels * rows, n0 = p % col_panels * cols;
    const int64_t m = std::min(rows, M - m0), n = std::min(cols, N - n0);
    sgemm_sliced(b_transposed, m, n, K, A + m0 * K, K, b_transposed ? B + n0 * K : B + n0, b_transposed ? K : N,
                 C + m0 * N + n0, N, forward_k_slice(N, K, true));
  });
}

Tensor CpuCommon::forward_widen(const Tensor& t) { return forward_widen_ref(t); }
Tensor CpuCommon::forward_round(const Tensor& x, DType to) { return forward_round_ref(x, to); }
Tensor CpuCommon::forward_select_rows(const Tensor& x, const std::vector<int64_t>& counted) {
  return forward_select_rows_ref(x, counted);
}
Tensor CpuCommon::forward_strided(const Tensor& x, const Strided& g) { return forward_strided_ref(x, g); }
Tensor CpuCommon::forward_reduce_rows(const Tensor& x, int64_t width, bool mean) {
  return forward_reduce_rows_ref(x, width, mean);
}
Tensor CpuCommon::forward_softmax_rows(const Tensor& x, int64_t width) { return forward_softmax_rows_ref(x, width); }
Tensor CpuCommon::forward_binary(ForwardBinary op, const Tensor& a, const Tensor& b) {
  return forward_binary_ref(op, a, b);
}
Tensor CpuCommon::forward_unary(ForwardUnary op, const Tensor& x) { return forward_unary_ref(op, x); }
std::vector<Tensor> CpuCommon::forward_norm(const NormArgs& a) { return forward_norm_ref(a); }
std::vector<Tensor> CpuCommon::forward_attention(const AttentionArgs& a) { return forward_attention_ref(a); }

}  // namespace nibble::kernels

#include "forward/matmul.h"

#include <chrono>

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "forward/half_rows.h"
#include "kernels/forward_math.h"
#include "kernels/forward_types.h"
#include "kernels/half_float.h"
#include "kernels/parallel.h"
#include "loaders/error.h"

namespace nibble::forward {

void matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed) {
  kernels::fw::matmul_ref(A, B, C, M, K, N, b_transposed);
}

void use_single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

namespace {

// C[m, n] (leading dimension ldc) = A[m, K] (lda) · op(B) (ldb), K in slices of k_slice: one sgemm per
// slice, each added to the sum of the slices before it (forward_k_slice says why).
void sgemm_sliced(bool b_transposed, int64_t m, int64_t n, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* C, int64_t ldc, int64_t k_slice) {
  const int64_t step = k_slice > 0 ? k_slice : std::max<int64_t>(K, 1);
  for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += step) {
    const int64_t kk = std::min(step, K - k0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, int(m), int(n), int(kk), 1.0f,
                A + k0, int(lda), b_transposed ? B + k0 : B + k0 * ldb, int(ldb), k0 ? 1.0f : 0.0f, C, int(ldc));
  }
}

}  // namespace

void matmul_blas(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed,
                 int64_t k_slice) {
  if (M > INT_MAX || K > INT_MAX || N > INT_MAX) throw Error("forward: a product too large for 32-bit BLAS indices");
  if (M == 0 || N == 0) return;
  use_single_threaded_blas();
  sgemm_sliced(b_transposed, M, N, K, A, K, B, b_transposed ? K : N, C, N, k_slice);
}

int64_t panel_rows(int64_t M) { return kernels::forward_panel_rows(M); }

int64_t panel_columns(int64_t N) { return kernels::forward_panel_columns(N); }

void matmul_parallel(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed,
                     int64_t k_slice) {
  const int64_t rows = panel_rows(M), cols = panel_columns(N);
  const int64_t row_panels = (M + rows - 1) / rows, col_panels = (N + cols - 1) / cols;
  if (row_panels * col_panels <= 1) return matmul_blas(A, B, C, M, K, N, b_transposed, k_slice);
  use_single_threaded_blas();  // before any worker calls it
  if (M > INT_MAX || K > INT_MAX || N > INT_MAX) throw Error("forward: a product too large for 32-bit BLAS indices");
  kernels::parallel_for(row_panels * col_panels, [&](int64_t p) {
    const int64_t m0 = p / col_panels * rows, n0 = p % col_panels * cols;
    const int64_t m = std::min(rows, M - m0), n = std::min(cols, N - n0);
    sgemm_sliced(b_transposed, m, n, K, A + m0 * K, K, b_transposed ? B + n0 * K : B + n0, b_transposed ? K : N,
                 C + m0 * N + n0, N, k_slice);
  });
}

void matmul_widening(ProductMeter* meter, const float* A, DType b_type, const uint16_t* B, float* C, int64_t M,
                     int64_t K, int64_t N, Floats& scratch) {
  if (M > INT_MAX || K > INT_MAX || N > INT_MAX) throw Error("forward: a product too large for 32-bit BLAS indices");
  if (M == 0 || N == 0) return;
  use_single_threaded_blas();
  const int64_t rows = panel_rows(M), cols = panel_columns(N);
  const int64_t row_panels = (M + rows - 1) / rows, col_panels = (N + cols - 1) / cols;
  // Column panels widened together: enough panels for two per worker thread (a few rows of A leave one
  // row panel per column panel).
  const int64_t group = std::clamp<int64_t>((2 * kernels::num_threads() + row_panels - 1) / row_panels, 1, col_panels);
  for (int64_t c0 = 0; c0 < col_panels; c0 += group) {
    const int64_t n0 = c0 * cols, nb = std::min(group * cols, N - n0), panels = (nb + cols - 1) / cols;
    const auto t0 = std::chrono::steady_clock::now();  // the widening counts with the products (matmul.h)
    scratch.resize(size_t(K * nb));
    float* W = scratch.data();
    const int64_t per = std::max<int64_t>(1, (int64_t(1) << 15) / nb);  // rows of B per chunk
    kernels::parallel_for((K + per - 1) / per, [&](int64_t chunk) {
      for (int64_t k = chunk * per; k < std::min(K, (chunk + 1) * per); ++k) {
        const uint16_t* in = B + k * N + n0;
        float* out = W + k * nb;
        if (b_type == DType::kFloat16)
          halves_to_floats(in, out, nb);
        else
          for (int64_t j = 0; j < nb; ++j) out[j] = bf16_to_float(in[j]);
      }
    });
    kernels::parallel_for(row_panels * panels, [&](int64_t p) {  // matmul_parallel's panels, B's block in W
      const int64_t m0 = p / panels * rows, j0 = p % panels * cols;
      const int64_t m = std::min(rows, M - m0), n = std::min(cols, nb - j0);
      sgemm_sliced(false, m, n, K, A + m0 * K, K, W + j0, nb, C + m0 * N + n0 + j0, N, kernels::forward_k_slice(N, K, true));
    });
    if (meter) {
      meter->flop += 2.0 * double(M) * double(K) * double(nb);
      meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
}

void matmul_counted(ProductMeter* meter, const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N,
                    bool b_transposed, int64_t k_slice) {
  const auto t0 = std::chrono::steady_clock::now();
  matmul_parallel(A, B, C, M, K, N, b_transposed, k_slice);
  if (!meter) return;
  meter->flop += 2.0 * double(M) * double(K) * double(N);
  meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace nibble::forward

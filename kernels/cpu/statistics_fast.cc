#include "kernels/cpu/statistics_fast.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/cpu/awq_fast.h"
#include "kernels/cpu/statistics_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

constexpr int64_t kPanel = kStatisticsPanelColumns;

// The upper triangle of XᵀX in column panels, one per task: the panel's rows above its diagonal block by
// sgemm, the block by ssyrk, each on one thread into the task's own float32 buffer (rows 0..j0 + w of the
// panel's w columns: never a whole K x K copy, 485 MB for K = 11008), then folded into the float64 sum by the
// same task.
void add_whole_product(const float* X, int64_t n, int64_t K, double* gram) {
  parallel_for(num_blocks(K, kPanel), [&](int64_t p) {
    const int64_t j0 = p * kPanel, w = std::min(kPanel, K - j0);
    // [j0 + w, w]: only its upper part is written and read (left uninitialised: the products write it)
    const std::unique_ptr<float[]> g(new float[size_t((j0 + w) * w)]);
    if (j0)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(j0), int(w), int(n), 1.0f, X, int(K), X + j0, int(K), 0.0f,
                  g.get(), int(w));
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(w), int(n), 1.0f, X + j0, int(K), 0.0f, g.get() + j0 * w,
                int(w));
    for (int64_t i = 0; i < j0 + w; ++i) {
      double* row = gram + packed_row(i, K) - i;  // row[j] is (i, j) for j >= i
      for (int64_t j = std::max(i, j0); j < j0 + w; ++j) row[j] += g[size_t(i * w + j - j0)];
    }
  });
}

// Only the diagonal blocks (awq_clip's statistics): one block per task, each product into both triangles
// (the lower one sums the same float32 values in the same order: the upper's doubles).
void add_block_products(const float* X, int64_t n, int64_t K, int64_t B, double* gram) {
  parallel_for(num_blocks(K, B), [&](int64_t b) {
    const int64_t w = std::min(B, K - b * B);
    const std::unique_ptr<float[]> g(new float[size_t(w * w)]);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(w), int(n), 1.0f, X + b * B, int(K), 0.0f, g.get(), int(w));
    double* dst = gram + b * B * B;
    for (int64_t i = 0; i < w; ++i)
      for (int64_t j = i; j < w; ++j) {
        dst[i * B + j] += g[size_t(i * w + j)];
        if (j > i) dst[j * B + i] += g[size_t(i * w + j)];
      }
  });
}

}  // namespace

void accumulate_statistics_fast(const float* x, int64_t n, ActivationSums& s) {
  make_host_statistics(s);
  const int64_t K = s.K, B = s.gram_block;
  double* sum_abs = host_sum_abs(s);
  parallel_for(num_blocks(K, kPanel), [&](int64_t p) {  // each column's sum in row order
    const int64_t k0 = p * kPanel, k1 = std::min(K, k0 + kPanel);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = k0; k < k1; ++k) sum_abs[k] += std::fabs(x[r * K + k]);
  });
  use_single_threaded_blas();  // the tasks are the parallel part; a product's bits then do not depend on it
  double* gram = host_gram(s);
  for (int64_t r0 = 0; r0 < n; r0 += kStatisticsRowsPerProduct) {
    const int64_t m = std::min(kStatisticsRowsPerProduct, n - r0);
    if (B)
      add_block_products(x + r0 * K, m, K, B, gram);
    else
      add_whole_product(x + r0 * K, m, K, gram);
  }
  s.rows += n;
}

}  // namespace nibble::kernels

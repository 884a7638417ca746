#include "calib/engine_statistics.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "forward/buffer_pool.h"
#include "kernels/parallel.h"
#include "kernels/quant_types.h"

namespace nibble {

ActivationAccumulator::ActivationAccumulator(int64_t K, int64_t gram_block) {
  m_.K = K;
  m_.gram_block = gram_block;
  m_.sum_abs.assign(size_t(K), 0.0);
  m_.packed = gram_block == 0;
  m_.gram.assign(gram_block ? size_t(kernels::num_blocks(K, gram_block) * gram_block * gram_block)
                            : size_t(packed_row(K, K)), 0.0);
}

void ActivationAccumulator::add_rows(const float* x, int64_t rows, const int64_t* counted) {
  const int64_t K = m_.K;
  int64_t n = rows;
  forward::Floats packed;  // the counted rows side by side, where a mask leaves gaps
  if (counted && std::count(counted, counted + rows, int64_t(0)) > 0) {
    packed.resize(size_t(rows * K));
    n = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (counted[r]) std::copy_n(x + r * K, K, packed.data() + n++ * K);
    x = packed.data();
  }
  kernels::parallel_for((K + kPanelColumns - 1) / kPanelColumns, [&](int64_t p) {  // each column's sum in row order
    const int64_t k0 = p * kPanelColumns, k1 = std::min(K, k0 + kPanelColumns);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = k0; k < k1; ++k) m_.sum_abs[size_t(k)] += std::fabs(x[r * K + k]);
  });
  m_.rows += n;
  for (int64_t r0 = 0; r0 < n; r0 += kRowsPerProduct) add_product(x + r0 * K, std::min(kRowsPerProduct, n - r0));
}

// The upper triangle of XᵀX in column panels of kPanelColumns, one per task: the panel's rows above its
// diagonal block by sgemm, the block by ssyrk, each on one thread into the task's own float32 buffer
// (rows 0..j0 + w of the panel's w columns: never a whole K x K copy, 485 MB for K = 11008), then folded
// into the float64 sum by the same task. The panels depend only on K, so the sums do not depend on
// --threads.
void ActivationAccumulator::add_whole_product(const float* X, int64_t n) {
  const int64_t K = m_.K;
  kernels::parallel_for((K + kPanelColumns - 1) / kPanelColumns, [&](int64_t p) {
    const int64_t j0 = p * kPanelColumns, w = std::min(kPanelColumns, K - j0);
    forward::Floats g(size_t((j0 + w) * w));  // [j0 + w, w]: only its upper part is written and read
    if (j0)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(j0), int(w), int(n), 1.0f, X, int(K), X + j0, int(K), 0.0f,
                  g.data(), int(w));
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(w), int(n), 1.0f, X + j0, int(K), 0.0f, g.data() + j0 * w,
                int(w));
    for (int64_t i = 0; i < j0 + w; ++i) {
      double* row = m_.gram.data() + packed_row(i, K) - i;  // row[j] is (i, j) for j >= i
      for (int64_t j = std::max(i, j0); j < j0 + w; ++j) row[j] += g[size_t(i * w + j - j0)];
    }
  });
}

// Only the diagonal blocks (awq_clip's statistics): one block per task.
void ActivationAccumulator::add_block_products(const float* X, int64_t n) {
  const int64_t K = m_.K, B = m_.gram_block;
  kernels::parallel_for(kernels::num_blocks(K, B), [&](int64_t b) {
    const int64_t w = std::min(B, K - b * B);
    forward::Floats g(size_t(w * w));
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(w), int(n), 1.0f, X + b * B, int(K), 0.0f, g.data(), int(w));
    double* dst = m_.gram.data() + b * B * B;
    for (int64_t i = 0; i < w; ++i)
      for (int64_t j = i; j < w; ++j) dst[i * B + j] += g[size_t(i * w + j)];
  });
}

void ActivationAccumulator::add_product(const float* X, int64_t n) {
  const int64_t K = m_.K, B = m_.gram_block;
  const auto t0 = std::chrono::steady_clock::now();
  forward::use_single_threaded_blas();
  if (B) {
    add_block_products(X, n);
    for (int64_t b = 0; b < kernels::num_blocks(K, B); ++b) {
      const int64_t w = std::min(B, K - b * B);
      products_.flop += double(n) * double(w) * double(w + 1);
    }
  } else {
    add_whole_product(X, n);
    products_.flop += double(n) * double(K) * double(K + 1);
  }
  products_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

MeasuredActivation ActivationAccumulator::finish() {
  const int64_t K = m_.K, B = m_.gram_block;
  for (int64_t b = 0; B && b < kernels::num_blocks(K, B); ++b) {  // a whole XᵀX stays packed (unpack_gram)
    double* g = m_.gram.data() + b * B * B;
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < i; ++j) g[i * B + j] = g[j * B + i];
  }
  return std::move(m_);
}

}  // namespace nibble

#include "calib/engine_statistics.h"

#include <cblas.h>

#include <cmath>

#include "kernels/quant_types.h"

namespace nibble {

ActivationAccumulator::ActivationAccumulator(int64_t K, int64_t gram_block) {
  m_.K = K;
  m_.gram_block = gram_block;
  m_.sum_abs.assign(size_t(K), 0.0);
  m_.gram.assign(gram_block ? size_t(kernels::num_blocks(K, gram_block) * gram_block * gram_block) : size_t(K * K), 0.0);
  pending_.resize(size_t(kRowsPerProduct * K));
}

void ActivationAccumulator::add_rows(const float* x, int64_t rows, const int64_t* counted) {
  const int64_t K = m_.K;
  for (int64_t r = 0; r < rows; ++r) {
    if (counted && !counted[r]) continue;
    const float* row = x + r * K;
    std::copy_n(row, K, pending_.data() + pending_rows_ * K);
    for (int64_t k = 0; k < K; ++k) m_.sum_abs[size_t(k)] += std::fabs(row[k]);
    ++m_.rows;
    if (++pending_rows_ == kRowsPerProduct) flush();
  }
}

void ActivationAccumulator::flush() {
  const int64_t K = m_.K, B = m_.gram_block, n = pending_rows_;
  if (n == 0) return;
  const float* X = pending_.data();
  if (!B) {
    std::vector<float> g(size_t(K * K), 0.0f);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(K), int(n), 1.0f, X, int(K), 0.0f, g.data(), int(K));
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i; j < K; ++j) m_.gram[size_t(i * K + j)] += g[size_t(i * K + j)];
  } else {
    std::vector<float> g(size_t(B * B));
    for (int64_t b = 0; b < kernels::num_blocks(K, B); ++b) {
      const int64_t w = std::min(B, K - b * B);
      std::fill(g.begin(), g.end(), 0.0f);
      cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, int(w), int(n), 1.0f, X + b * B, int(K), 0.0f, g.data(), int(B));
      double* dst = m_.gram.data() + b * B * B;
      for (int64_t i = 0; i < w; ++i)
        for (int64_t j = i; j < w; ++j) dst[i * B + j] += g[size_t(i * B + j)];
    }
  }
  pending_rows_ = 0;
}

MeasuredActivation ActivationAccumulator::finish() {
  flush();
  const int64_t K = m_.K, B = m_.gram_block;
  const int64_t n = B ? B : K, count = B ? kernels::num_blocks(K, B) : 1;
  for (int64_t b = 0; b < count; ++b) {
    double* g = m_.gram.data() + b * n * n;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) g[i * n + j] = g[j * n + i];
  }
  pending_ = {};
  return std::move(m_);
}

}  // namespace nibble

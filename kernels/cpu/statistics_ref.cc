#include "kernels/cpu/statistics_ref.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace nibble::kernels {

void make_host_statistics(ActivationSums& s) {
  if (s.K <= 0 || s.gram_block < 0) throw std::invalid_argument("accumulate_statistics: K must be positive");
  if (!s.sum_abs.empty()) return;
  s.sum_abs = host_tensor(DType::kFloat64, {s.K}, std::vector<double>(size_t(s.K), 0.0));
  const int64_t n = statistics_gram_values(s.K, s.gram_block);
  s.gram = host_tensor(DType::kFloat64, {n}, std::vector<double>(size_t(n), 0.0));
}

namespace {
double* writable(const Tensor& t) {
  // Only the backend's own HostArray (make_host_statistics) is written: never a view of the caller's memory.
  if (!dynamic_cast<const HostArray<double>*>(t.buffer.get()))
    throw std::invalid_argument("accumulate_statistics: statistics held by another backend");
  return const_cast<double*>(t.f64());
}
}  // namespace

double* host_sum_abs(ActivationSums& s) { return writable(s.sum_abs); }
double* host_gram(ActivationSums& s) { return writable(s.gram); }

void add_sum_abs(const float* x, int64_t n, int64_t K, double* sum_abs) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < K; ++k) sum_abs[k] += std::fabs(x[r * K + k]);
}

namespace {
float dot_rows(const float* x, int64_t n, int64_t K, int64_t i, int64_t j) {
  float d = 0.0f;
  for (int64_t r = 0; r < n; ++r) d += x[r * K + i] * x[r * K + j];
  return d;
}
}  // namespace

void accumulate_statistics_ref(const float* x, int64_t n, ActivationSums& s) {
  make_host_statistics(s);
  const int64_t K = s.K, B = s.gram_block;
  add_sum_abs(x, n, K, host_sum_abs(s));
  double* g = host_gram(s);
  for (int64_t r0 = 0; r0 < n; r0 += kStatisticsRowsPerProduct) {
    const float* X = x + r0 * K;
    const int64_t m = std::min(kStatisticsRowsPerProduct, n - r0);
    if (B) {  // each diagonal block, both triangles
      for (int64_t b = 0; b < num_blocks(K, B); ++b)
        for (int64_t i = 0; i < std::min(B, K - b * B); ++i)
          for (int64_t j = 0; j < std::min(B, K - b * B); ++j)
            g[b * B * B + i * B + j] += dot_rows(X, m, K, b * B + std::min(i, j), b * B + std::max(i, j));
    } else {
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = i; j < K; ++j) g[packed_row(i, K) - i + j] += dot_rows(X, m, K, i, j);
    }
  }
  s.rows += n;
}

std::vector<double> unpack_gram_ref(const double* packed, int64_t K) {
  std::vector<double> whole(size_t(K * K));
  for (int64_t i = 0; i < K; ++i) {
    const double* row = packed + packed_row(i, K) - i;  // row[j] is (i, j) for j >= i
    for (int64_t j = i; j < K; ++j) whole[size_t(i * K + j)] = whole[size_t(j * K + i)] = row[j];
  }
  return whole;
}

std::vector<float> to_f32_ref(const double* v, int64_t n) { return std::vector<float>(v, v + n); }

bool all_finite_ref(const double* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return false;
  return true;
}

}  // namespace nibble::kernels

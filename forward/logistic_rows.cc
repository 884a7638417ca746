#include "forward/logistic_rows.h"

#include <immintrin.h>

#include "forward/cpu_features.h"
#include "kernels/forward_math.h"

namespace nibble::forward {

namespace {

// The scalar function's operations lane by lane: max(lo, v) and min(hi, v) keep a NaN v (the second
// operand is returned when one is NaN), as the scalar comparisons do.
__attribute__((target("avx2,fma"))) void logistic_rows_fma(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  const __m256 lo = _mm256_set1_ps(-18.0f), hi = _mm256_set1_ps(18.0f);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(in + i)));
    const __m256 v2 = _mm256_mul_ps(v, v);
    __m256 p = _mm256_fmadd_ps(v2, _mm256_set1_ps(4.37031012579801e-11f), _mm256_set1_ps(1.15627324459942e-07f));
    p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(6.08574864600143e-05f));
    p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(8.51377133304701e-03f));
    p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(2.48287947061529e-01f));
    p = _mm256_mul_ps(p, v);
    __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(6.10247389755681e-13f), _mm256_set1_ps(5.76102136993427e-09f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(6.29106785017040e-06f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(1.70198817374094e-03f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(1.16817656904453e-01f));
    q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(9.93151921023180e-01f));
    const __m256 r = _mm256_add_ps(_mm256_div_ps(p, q), half);
    _mm256_storeu_ps(out + i, _mm256_min_ps(one, _mm256_max_ps(zero, r)));
  }
  for (; i < n; ++i) out[i] = kernels::fw::sigmoid(in[i]);
}

}  // namespace

void logistic_rows(const float* in, float* out, int64_t n) {
  if (cpu_has_avx2_fma()) return logistic_rows_fma(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::fw::sigmoid(in[i]);
}

}  // namespace nibble::forward

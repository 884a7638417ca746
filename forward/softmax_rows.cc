#include "forward/softmax_rows.h"

#include <immintrin.h>

#include "forward/cpu_features.h"
#include "kernels/forward_math.h"

namespace nibble::forward {

namespace {

// kernels::fw::softmax_exp on eight lanes, operation for operation.
__attribute__((target("avx2,fma"))) __m256 softmax_exp8(__m256 x) {
  const __m256 bias = _mm256_set1_ps(12582912.0f);
  x = _mm256_max_ps(_mm256_set1_ps(-103.9720840454f), x);  // a NaN x is kept (the second operand)
  const __m256 biased = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), bias);
  const __m256 m = _mm256_sub_ps(biased, bias);
  x = _mm256_fmadd_ps(m, _mm256_set1_ps(-6.93145752e-1f), x);
  x = _mm256_fmadd_ps(m, _mm256_set1_ps(-1.42860677e-6f), x);
  __m256 p = _mm256_set1_ps(0x1.694000p-10f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.125edcp-7f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.555b5ap-5f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.555450p-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(0x1.fffff6p-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.0f));
  // scale_pow2: 2^k through the exponent bits, or 2^(k+64) then 2^-64 where the result is subnormal
  const __m256i k = _mm256_cvtps_epi32(m);
  const __m256i normal = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(-127));
  const __m256i e1 = _mm256_add_epi32(k, _mm256_blendv_epi8(_mm256_set1_epi32(64 + 127), _mm256_set1_epi32(127), normal));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(e1, 23));
  const __m256 s2 = _mm256_blendv_ps(_mm256_set1_ps(0x1p-64f), _mm256_set1_ps(1.0f), _mm256_castsi256_ps(normal));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

__attribute__((target("avx2,fma"))) void softmax_row_fma(float* row, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = m < row[j] ? row[j] : m;
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 e0 = softmax_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
    const __m256 e1 = softmax_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), vm));
    _mm256_storeu_ps(row + j, e0);
    _mm256_storeu_ps(row + j + 8, e1);
    acc0 = _mm256_add_ps(acc0, e0);
    acc1 = _mm256_add_ps(acc1, e1);
  }
  float lane[16];
  _mm256_storeu_ps(lane, acc0);
  _mm256_storeu_ps(lane + 8, acc1);
  for (int64_t l = 0; j < n; ++j, ++l) {
    row[j] = kernels::fw::softmax_exp(row[j] - m);
    lane[l] += row[j];
  }
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = lane[i + 8] + lane[i];
  const float scale = 1.0f / (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
  const __m256 vs = _mm256_set1_ps(scale);
  j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), vs));
  for (; j < n; ++j) row[j] *= scale;
}

}  // namespace

void softmax_row_mlas(float* row, int64_t n) {
  if (cpu_has_avx2_fma()) return softmax_row_fma(row, n);
  kernels::fw::softmax_mlas(row, n);
}

}  // namespace nibble::forward

#include "forward/half_rows.h"

#include <immintrin.h>

#include "forward/cpu_features.h"
#include "kernels/half_float.h"

namespace nibble::forward {

namespace {

// vcvtph2ps quiets a signalling NaN; the scalar conversion keeps its payload as it is: those lanes are
// taken from the integer form (exponent 31 rebiased to 255, mantissa shifted).
__attribute__((target("avx2,f16c"))) void halves_to_floats_f16c(const uint16_t* h, float* out, int64_t n) {
  int64_t i = 0;
  const __m256i exp_mask = _mm256_set1_epi32(0x7c00), man_mask = _mm256_set1_epi32(0x03ff);
  for (; i + 8 <= n; i += 8) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    __m256 f = _mm256_cvtph_ps(raw);
    const __m256i w = _mm256_cvtepu16_epi32(raw);
    const __m256i nan = _mm256_andnot_si256(
        _mm256_cmpeq_epi32(_mm256_and_si256(w, man_mask), _mm256_setzero_si256()),
        _mm256_cmpeq_epi32(_mm256_and_si256(w, exp_mask), exp_mask));
    if (!_mm256_testz_si256(nan, nan)) {
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16);
      const __m256i bits = _mm256_or_si256(
          sign, _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7fff)), 13),
                                 _mm256_set1_epi32(0x70000000)));
      f = _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
    }
    _mm256_storeu_ps(out + i, f);
  }
  for (; i < n; ++i) out[i] = half_to_float(h[i]);
}

// vcvtps2ph rounds to nearest even as the scalar conversion does (65520 and up to infinity, subnormals at
// 2^-24); a NaN keeps part of its payload there, where the scalar conversion gives 0x7e00: those lanes fixed.
__attribute__((target("avx2,f16c"))) void floats_to_halves_f16c(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_loadu_ps(x + i);
    __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(f), abs_mask);
    const __m256i nan = _mm256_cmpgt_epi32(a, inf);
    if (!_mm256_testz_si256(nan, nan)) {
      const __m256i sign = _mm256_srli_epi32(_mm256_andnot_si256(abs_mask, _mm256_castps_si256(f)), 16);
      const __m256i quiet = _mm256_or_si256(sign, _mm256_set1_epi32(0x7e00));
      const __m256i wide = _mm256_blendv_epi8(_mm256_cvtepu16_epi32(h), quiet, nan);
      // back to 8 halves: the low 16 bits of each lane, in order
      const __m256i packed = _mm256_packus_epi32(wide, wide);
      h = _mm_unpacklo_epi64(_mm256_castsi256_si128(packed), _mm256_extracti128_si256(packed, 1));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float_to_half(x[i]);
}

}  // namespace

void halves_to_floats(const uint16_t* h, float* out, int64_t n) {
  if (cpu_has_avx2_f16c()) return halves_to_floats_f16c(h, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(h[i]);
}

void floats_to_halves(const float* x, uint16_t* out, int64_t n) {
  if (cpu_has_avx2_f16c()) return floats_to_halves_f16c(x, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(x[i]);
}

}  // namespace nibble::forward

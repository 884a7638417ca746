// The CPU backend's GPTQ: the factor through LAPACK (float64), the sweep in float32 over column chunks
// on our own threads, with lazy batches (the compensation of a batch of channels on every later channel
// is one sgemm). The same quantities as gptq_ref.h up to float rounding; tested against it.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

GptqFactor gptq_factor_fast(const double* gram, int64_t K, const float* inv_s, double percdamp, bool act_order);
void gptq_quantize_fast(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                        QuantResult& out);

}  // namespace nibble::kernels

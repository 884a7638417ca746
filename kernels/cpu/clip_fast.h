// The CPU backend's Gram-form clip search (clip_quantize_gram_ref, clip_ref.h, arranged for speed:
// column tiles, vectorizable residual loops, one sgemm per candidate and block tile). Same
// residuals bit for bit; the losses differ only in float summation order, so a block may choose
// differently from the reference only where two candidates' losses tie to that order.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/quant_types.h"

namespace nibble::kernels {

void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const double* gram, int64_t gram_block,
                        const float* inv_s, const GramClipOptions& opt, QuantResult& out,
                        std::vector<float>* chosen = nullptr);

}  // namespace nibble::kernels

// The CPU backend's RTN: the same arithmetic as rtn_quantize_ref (bit for bit; tested against
// it), arranged for speed: dtype fixed at compile time, a table for fp16 loads, row-contiguous
// passes over [K, N] weights that the compiler vectorizes, and a branch-free exact rint.
#pragma once
#include "kernels/quant_types.h"

namespace nibble::kernels {

void rtn_quantize_fast(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out);

// rtn_quantize_weighted (rtn_ref.h), bit for bit, vectorized over the columns of [K, N] weights.
void rtn_quantize_weighted_fast(const WeightMatrix& w, const QuantSpec& spec, const float* weight,
                                const std::vector<float>& ratios, QuantResult& out);

}  // namespace nibble::kernels

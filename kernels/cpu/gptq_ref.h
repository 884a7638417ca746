// GPTQ on the CPU, the reference: the inverse-Hessian factor and the column-by-column sweep in plain
// scalar float64 (no lazy batches), the definition the fast kernels (gptq_fast.h) are tested against.
//
// For a weight W [K, N] and H = XᵀX (+ dampening), GPTQ quantizes the input channels one at a time in
// the sweep order; the rounding error e of channel i (divided by U[i][i], H⁻¹ = UᵀU) is compensated on
// the channels still to come, row j -= U[i][j] e. Each block's scale is fixed when the sweep first
// reaches one of its channels, from the block's values at that moment (so act-order keeps contiguous
// blocks, the only kind DequantizeLinear and MatMulNBits can express).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/rtn_ref.h"

namespace nibble::kernels {

// What both factor kernels start from: H in sweep order (K x K float64), with its dead channels,
// energies and permutation filled into f (f.upper left empty).
std::vector<double> gptq_prepare_hessian(const double* gram, int64_t K, const float* inv_s, bool act_order,
                                         GptqFactor& f);
// percdamp * mean(diag H), then 10x more per attempt (at least 1e-6 of the mean): attempt 0..4.
double gptq_damp(const std::vector<double>& h, int64_t K, double percdamp, int attempt);

// The scale (and zero point) of one block of n values: the candidate (ratios x, when symmetric and
// opt.both_signs, both signs) with the smallest Σ weight[t] (v[t] - ŵ[t])², ŵ rounded to `st`; the
// first in candidate order on ties. `partial`: the block is shorter than spec.block (zero padding
// counted in [min, max], as plain RTN does).
BlockParams gptq_block_params(const float* v, const float* weight, int64_t n, bool partial, const QuantSpec& spec,
                              DType st, const GptqOptions& opt);

GptqFactor gptq_factor_ref(const double* gram, int64_t K, const float* inv_s, double percdamp, bool act_order);
void gptq_quantize_ref(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                       QuantResult& out);

}  // namespace nibble::kernels

// AWQ on the CPU, the reference: the statistics, the scale formula, weight scaling and the loss,
// plain scalar code that calls no fast kernel, written to match ModelOpt's numpy arithmetic where
// that matters for bit-exact codes (the fast versions are in awq_fast.h).
//
// The loss uses the Gram form: for D = W - diag(1/s) Ŵ (Ŵ = dequant(quant(W ⊙ s))),
//   L = mean_{t,n} (X W - (X ⊘ s) Ŵ)^2 = trace(Dᵀ (XᵀX) D) / (T N),
// so calibration keeps XᵀX (K x K) instead of every token row (T x K), and one candidate costs
// a K x K x N product instead of T x K x N.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

// numpy's float32 add.reduce over a contiguous run (pairwise summation, blocks of 8 below 128).
float numpy_sum_f32(const float* a, int64_t n);

// The weight as float32 in its logical [K, N] layout (transposed from [N, K] when k_axis == 1).
std::vector<float> logical_weight(const WeightMatrix& w);

// ModelOpt's get_weight_scale: |W| normalised by the max of its group, averaged over N. ModelOpt
// groups rows k, k + G, k + 2G, ... (a reshape of the padded [Kp, N] array to [block, -1]), not the
// contiguous block; `contiguous` = true uses the contiguous block instead (nibble mode).
std::vector<float> weight_mean(const std::vector<float>& w_kn, int64_t K, int64_t N, int64_t block, bool contiguous);

// ModelOpt's per-subgraph weight statistic (Backend::awq_weight_mean_joint).
std::vector<float> weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block);

// ModelOpt's get_scale in fp32 with libm's powf (nibble mode; ModelOpt's own numbers come from
// numpy's SIMD power, see calib/README.md).
std::vector<float> awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean, double alpha);

// W ⊙ s along K in fp32 whatever w.dtype is (nibble mode), stored layout.
std::vector<uint8_t> scale_weight_f32(const WeightMatrix& w, const float* s);

// W ⊙ s along K, rounded to w.dtype, in the stored layout (what gets quantized).
std::vector<uint8_t> scale_weight(const WeightMatrix& w, const float* s);

// W ⊘ d along N, rounded to w.dtype: w / round_to(dtype, d[n]) (a consumer's 1/s folded into the
// columns of a weight that is itself quantized, divided before quantizing it).
std::vector<uint8_t> divide_columns(const WeightMatrix& w, const float* d);

// diag(XᵀX)[k] / s[k]² as float (s null: diag(XᵀX)[k]): the per-channel weight of the clip choice.
std::vector<float> channel_energy(const double* gram, int64_t K, const float* s);

// U with XᵀX = UᵀU (row-major upper triangle), float64 Cholesky–Banachiewicz rows, the same diagonal
// shifts as gram_cholesky_upper (awq_fast.h); empty when even the last shift fails.
std::vector<float> gram_cholesky_upper_ref(const double* gram, int64_t K);

// What the AWQ loss quantizes for scale s: W ⊙ s rounded to w.dtype (plain RTN), or with `clip` in
// fp32 with scales rounded to w.dtype and the per-channel clip weight diag(gram32)[k] / s[k]²
// (`energy`, for rtn_quantize_weighted). `w` points into `bytes`.
struct LossWeight {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  QuantSpec spec;
  std::vector<float> energy;
};
LossWeight loss_weight(const WeightMatrix& w, const float* s, const QuantSpec& spec, const float* gram32, bool clip);

// D = W - Ŵ / s in the logical [K, N] layout, Ŵ = the dequantized q of l as DequantizeLinear gives it
// (in l's dtype); w_kn is logical_weight of the original weight.
std::vector<float> loss_residual(const LossWeight& l, const QuantResult& q, const std::vector<float>& w_kn,
                                 const float* s);

// The AWQ loss of scale s for weight w (stored layout) against gram32 (XᵀX, K x K float32) over
// `rows` tokens, summed in float64. The scaled weight is quantized as the final weight is: without
// clip_ratios W ⊙ s rounded to w.dtype and plain RTN; with them W ⊙ s in fp32 and each block picking
// its ratio by the error weighted with diag(XᵀX)[k] / s[k]² (rtn_quantize_weighted).
double awq_loss_ref(const WeightMatrix& w, const float* s, const QuantSpec& spec, const float* gram32, int64_t rows,
                    const std::vector<float>* clip_ratios);

}  // namespace nibble::kernels

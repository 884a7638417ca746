// AWQ-lite on the CPU: the statistics and the loss, written to match ModelOpt's numpy arithmetic
// where that matters for bit-exact codes (reference spec §5.2-5.4).
//
// The loss uses the Gram form: for D = W - diag(1/s) Ŵ (Ŵ = dequant(quant(W ⊙ s))),
//   L = mean_{t,n} (X W - (X ⊘ s) Ŵ)^2 = trace(Dᵀ (XᵀX) D) / (T N),
// so calibration keeps XᵀX (K x K) instead of every token row (T x K), and one candidate costs
// a K x K x N GEMM instead of T x K x N.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/awq_types.h"

namespace nibble::kernels {

// numpy's float32 add.reduce over a contiguous run (pairwise summation, blocks of 8 below 128).
float numpy_sum_f32(const float* a, int64_t n);

// The weight as float32 in its logical [K, N] layout (transposed from [N, K] when k_axis == 1).
std::vector<float> logical_weight(const WeightMatrix& w);

// ModelOpt's get_weight_scale: |W| normalised by the max of its group, averaged over N. ModelOpt
// groups rows k, k + G, k + 2G, ... (a reshape of the padded [Kp, N] array to [block, -1]), not the
// contiguous block; `contiguous` = true uses the contiguous block instead (nibble mode).
std::vector<float> weight_mean(const std::vector<float>& w_kn, int64_t K, int64_t N, int64_t block, bool contiguous);

// ModelOpt's get_scale in fp32 with libm's powf (nibble mode; ModelOpt's own numbers come from
// numpy's SIMD power, see calib/README.md).
std::vector<float> awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean, double alpha);

// The AWQ loss of scale s for weight w (stored layout) against the Gram matrix gram32 (K x K fp32).
// The scaled weight is rounded to w.dtype and quantized with `spec` exactly as the final weight.
// With `clip_ratios`, the weight is quantized as nibble's final weights are: each block picks its
// clip ratio by the error weighted with diag(XᵀX)[k] / s[k]^2 (rtn_quantize_weighted).
// With `gram_upper` (gram_cholesky_upper of the same Gram matrix) the loss is ‖U D‖² instead of
// Σ D ⊙ (G D): one triangular product, half the flops of the GEMM, the same quantity up to float32
// rounding (nibble mode; modelopt mode keeps the GEMM form its parity was measured with).
double awq_loss(const WeightMatrix& w, const std::vector<float>& w_kn, const float* s, const QuantSpec& spec,
                const float* gram32, int64_t rows, const std::vector<float>* clip_ratios = nullptr,
                const float* gram_upper = nullptr);

// U with XᵀX = UᵀU (row-major, upper triangle; the strict lower triangle is zero), float32, from a
// float64 Cholesky factorisation. A Gram matrix that is only semi-definite (a channel that is always
// zero, fewer tokens than channels) gets a diagonal shift of 1e-12, then 1e-9 of its largest diagonal
// element, which changes no loss comparison; empty when even that fails (the GEMM form is used then).
std::vector<float> gram_cholesky_upper(const double* gram, int64_t K);

// W ⊙ s along K in fp32 whatever w.dtype is (nibble mode), stored layout.
std::vector<uint8_t> scale_weight_f32(const WeightMatrix& w, const float* s);

// OpenBLAS runs single-threaded inside our parallel_for (called by awq_loss).
void use_single_threaded_blas();

// W ⊙ s along K, rounded to w.dtype, in the stored layout (what gets quantized).
std::vector<uint8_t> scale_weight(const WeightMatrix& w, const float* s);

}  // namespace nibble::kernels

// The CPU backend's AWQ loss and Cholesky factor (OpenBLAS / LAPACK). The same quantities as
// awq_loss_ref and gram_cholesky_upper_ref (awq_ref.h) up to float summation order; tested against them.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

// The AWQ loss (awq_loss_ref) with the products in float32 BLAS: w_kn is logical_weight(w). With
// `gram_upper` (gram_cholesky_upper of the same Gram matrix) the loss is ‖U D‖² instead of
// Σ D ⊙ (G D): one triangular product, half the flops of the GEMM (nibble mode; modelopt mode keeps
// the GEMM form its parity was measured with). Each column is summed in column_dot_ref's order
// (kernels/tree_reduce.h, the CUDA backend's too), the columns in order: the result does not depend on
// the thread count, and equals the emulated device's when the BLAS products do.
//
// `work` (optional) holds the buffers of one candidate (W ⊙ s, codes, D: several bytes per weight each) for
// the next candidate of the same weight: the loss is the same with or without it, a fresh buffer per
// candidate only costs its page faults.
struct AwqLossWork {
  std::vector<uint8_t> scaled;
  QuantResult q;
  std::vector<float> d;
  std::vector<double> col;
};
double awq_loss(const WeightMatrix& w, const std::vector<float>& w_kn, const float* s, const QuantSpec& spec,
                const float* gram32, int64_t rows, const std::vector<float>* clip_ratios = nullptr,
                const float* gram_upper = nullptr, AwqLossWork* work = nullptr);

// U with XᵀX = UᵀU (row-major, upper triangle; the strict lower triangle is zero), float32, from a
// float64 LAPACK Cholesky factorisation. A Gram matrix that is only semi-definite (a channel that is
// always zero, fewer tokens than channels) gets the diagonal shifts of kCholeskyShifts (kernels/backend.h)
// in turn; empty when even the last fails (GEMM form then).
std::vector<float> gram_cholesky_upper(const double* gram, int64_t K);

// column_dot_ref of `width` adjacent columns of row-major arrays (row stride ld), bit for bit, the
// columns side by side so the loop vectorizes.
void column_dots(const float* a, const float* b, int64_t K, int64_t ld, int64_t width, double* out);

// logical_weight (awq_ref.h) on our threads, typed loops for the [K, N] layout; the same values.
std::vector<float> logical_weight_fast(const WeightMatrix& w);

// weight_mean(logical_weight(w), ...) (awq_ref.h) on our threads: the contiguous blocks' maxima per block
// row, each row's numpy-order sum as the reference's; the same bits (the strided form: the reference's
// arithmetic on logical_weight_fast).
std::vector<float> weight_mean_fast(const WeightMatrix& w, int64_t block, bool contiguous);


// OpenBLAS runs single-threaded inside our parallel_for.
void use_single_threaded_blas();

}  // namespace nibble::kernels

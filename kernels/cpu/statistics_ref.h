// The layer engine's activation statistics (backend_ops.inc, "Activation statistics"): the plain scalar
// definitions, and the host forms every backend shares (a statistic's storage, the packed triangle
// unfolded, the float32 Gram, the finiteness check).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace nibble::kernels {

// s's tensors as zeros in host memory (HostArray: the CPU backend's storage), where they are still empty.
void make_host_statistics(ActivationSums& s);
// The host arrays of s (made by make_host_statistics: the backend's own memory, written in place).
double* host_sum_abs(ActivationSums& s);
double* host_gram(ActivationSums& s);

// Σ|x| per channel over the rows of x [n, K], in row order, into sum_abs (what every backend does).
void add_sum_abs(const float* x, int64_t n, int64_t K, double* sum_abs);

// The definition: each product's elements as plain float32 dot products over its rows, in row order.
void accumulate_statistics_ref(const float* x, int64_t n, ActivationSums& s);

// The whole K x K (both triangles) from a packed upper triangle.
std::vector<double> unpack_gram_ref(const double* packed, int64_t K);
std::vector<float> to_f32_ref(const double* v, int64_t n);
bool all_finite_ref(const double* v, int64_t n);

}  // namespace nibble::kernels

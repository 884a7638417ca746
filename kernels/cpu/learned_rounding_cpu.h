// learned_rounding on the host (kernels/learned_rounding.h): the reference takes the rows one after the
// other, the CPU backend's kernel spreads tiles of rows over its threads and computes a tile's residuals in
// shared passes over the Gram matrix. Rows are independent and each row's sums are learn_row's, in its
// order, so both give the same bits whatever the thread count.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

LearnedRoundingStats learned_rounding_ref(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                          const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q);
LearnedRoundingStats learned_rounding_fast(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                           const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q);

}  // namespace nibble::kernels

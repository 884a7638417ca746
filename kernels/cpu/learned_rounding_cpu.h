// learned_rounding on the host (kernels/learned_rounding.h): the reference takes the rows one after the
// other, the CPU backend's kernel spreads them over its threads. Rows are independent and each is computed
// by the same function, so both give the same bits whatever the thread count.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

LearnedRoundingStats learned_rounding_ref(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                          const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q);
LearnedRoundingStats learned_rounding_fast(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                           const float* inv_s, const LearnedRoundingOptions& opt, QuantResult& q);

}  // namespace nibble::kernels

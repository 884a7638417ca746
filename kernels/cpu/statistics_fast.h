// The CPU backend's accumulate_statistics: the float32 products by OpenBLAS, single-threaded per column
// panel (or diagonal block) over our own threads, each folded into the float64 sums by the task that made it.
#pragma once
#include <cstdint>

#include "kernels/backend.h"

namespace nibble::kernels {

void accumulate_statistics_fast(const float* x, int64_t n, ActivationSums& s);

}  // namespace nibble::kernels

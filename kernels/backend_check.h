// Every backend operation on generated data against the reference backend (kernels/cpu `*_ref`),
// in the spirit of ggml's test-backend-ops: fp32, fp16 and bf16 weights, both layouts, 4 and 8
// bits, with and without zero point, a partial last block. Equality is bitwise where the arithmetic
// is the same (codes, scales, zero points, scaled weights, statistics, packings, clip choices);
// where only the summation order differs the bound is stated in the check:
//   sq_error            relative 1e-12 (float64 sums of the same terms); plain RTN's 2e-4 (an fp16 weight's
//                       blocks summed in float, the device's [N, K] layout adding its lanes' partial sums:
//                       2 (block - 1) float roundings at most, for the checks' largest block)
//   awq_losses          relative 2e-4 (float32 BLAS products over K terms against float64)
//   gram_cholesky_upper UᵀU within 2e-6 of G's largest diagonal element
// Used by tests/unit/test_backend_ops.cc and `nibble selftest`.
#pragma once
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace nibble::kernels {

struct OpCheck {
  std::string op;
  int cases = 0;       // generated inputs compared
  std::string error;   // empty: passed; else the first difference
  bool passed() const { return error.empty(); }
};

// Names of every Backend operation, in interface order.
const std::vector<std::string>& backend_op_names();

// Runs every operation of `b` and of the reference backend on the same generated inputs.
std::vector<OpCheck> check_backend_ops(Backend& b);

}  // namespace nibble::kernels

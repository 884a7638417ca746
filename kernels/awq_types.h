// Inputs and outputs of the AWQ-lite scale search (arrays only).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

// What calibration measured on one activation (a MatMul input with K channels).
struct ActivationStats {
  int64_t K = 0;
  int64_t rows = 0;             // tokens counted in gram
  const float* x_mean = nullptr;  // mean |x| per channel (float32)
  const double* gram = nullptr;   // X^T X, K*K row-major
};

// How the search runs.
struct AwqSearchSpec {
  QuantSpec quant;                 // bits, block (resolved), zero point of the final weight
  std::vector<double> alphas;      // grid, ascending
  bool modelopt_weight_mean = true;  // ModelOpt's strided grouping (else contiguous blocks)
};

struct AwqSearchResult {
  std::vector<double> losses;   // one per alpha
  int best = 0;                 // index of the first minimum
  std::vector<float> scale;     // s(alpha*), K values
};

}  // namespace nibble::kernels

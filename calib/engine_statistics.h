// One activation's statistics folded in batch by batch (the layer engine's calibration): the counted rows,
// Σ|x| per channel in float64, and XᵀX by ssyrk in float32 over blocks of up to kRowsPerProduct rows, each
// product added into float64 (calib/README.md's definition for ONNX Runtime's path, which takes 256 rows
// per product); whole, or only its diagonal blocks.
#pragma once
#include <cstdint>
#include <vector>

#include "calib/calibration.h"

namespace nibble {

class ActivationAccumulator {
 public:
  static constexpr int64_t kRowsPerProduct = 2048;
  ActivationAccumulator(int64_t K, int64_t gram_block);
  // Adds the rows of x ([rows, K] float32, row-major) whose `counted` flag is set (all when null).
  void add_rows(const float* x, int64_t rows, const int64_t* counted);
  // The statistics, XᵀX complete (both triangles).
  MeasuredActivation finish();

 private:
  MeasuredActivation m_;
  std::vector<float> pending_;  // counted rows not yet in a product
  int64_t pending_rows_ = 0;
  void flush();
};

}  // namespace nibble

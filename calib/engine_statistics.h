// One activation's statistics folded in batch by batch (the layer engine's calibration): the counted rows,
// Σ|x| per channel in float64, and XᵀX in float32, one product per batch run's rows (up to
// kRowsPerProduct at a time; in fixed column panels over the worker threads), each added into float64 (calib/README.md's definition for ONNX Runtime's
// path, which takes 256 rows per product); whole, or only its diagonal blocks. The rows are read where
// they are: nothing is copied but a masked run's counted rows.
#pragma once
#include <cstdint>
#include <vector>

#include "calib/calibration.h"
#include "forward/matmul.h"

namespace nibble {

class ActivationAccumulator {
 public:
  static constexpr int64_t kRowsPerProduct = 2048;
  ActivationAccumulator(int64_t K, int64_t gram_block);
  // Adds the rows of x ([rows, K] float32, row-major) whose `counted` flag is set (all when null).
  void add_rows(const float* x, int64_t rows, const int64_t* counted);
  // The statistics: diagonal blocks complete (both triangles), a whole XᵀX packed (unpack_gram).
  MeasuredActivation finish();
  // The ssyrk products so far: FLOPs (n·K·(K+1) each, the triangle computed) and seconds.
  const forward::ProductMeter& products() const { return products_; }

 private:
  MeasuredActivation m_;
  forward::ProductMeter products_;
  static constexpr int64_t kPanelColumns = 128;
  void add_product(const float* X, int64_t n);
  void add_whole_product(const float* X, int64_t n);
  void add_block_products(const float* X, int64_t n);
};

}  // namespace nibble

// One activation's statistics folded in batch by batch (the layer engine's calibration) on the backend the
// run uses (Backend::accumulate_statistics): the counted rows, Σ|x| per channel in float64, and XᵀX in
// float32 products (kernels::kStatisticsRowsPerProduct rows at a time, in fixed column panels) each added
// into float64 (calib/README.md's definition for ONNX Runtime's path, which takes 256 rows per product);
// whole, or only its diagonal blocks. The sums stay where the backend keeps them (a device's memory; host
// memory on the CPU) and are handed to the search there; only Σ|x| (K values) comes back.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include "calib/calibration.h"
#include "forward/matmul.h"
#include "kernels/backend.h"

namespace nibble {

class ActivationAccumulator {
 public:
  ActivationAccumulator(kernels::Backend& backend, int64_t K, int64_t gram_block);
  // Adds the rows of x ([rows, K] float32, row-major, host memory) whose `counted` flag is set (all when
  // null).
  void add_rows(const float* x, int64_t rows, const int64_t* counted);
  // The same for rows the backend holds (the forward on a device): x float32 [rows · K] there, rounded to
  // `round`'s grid first where it is fp16/bf16 (a wide value), the counted rows selected there.
  void add_device_rows(const kernels::Tensor& x, DType round, int64_t rows, const std::vector<int64_t>* counted);
  // The statistics: diagonal blocks complete (both triangles), a whole XᵀX packed (unpack_gram).
  MeasuredActivation finish();
  // The products so far: FLOPs (n·K·(K+1) each, the triangle computed) and seconds (a device's: until its
  // operation returned).
  const forward::ProductMeter& products() const { return products_; }

 private:
  // The FLOPs of accumulating n rows, and the seconds since t0.
  void count_products(int64_t n, std::chrono::steady_clock::time_point t0);
  kernels::Backend* backend_;
  kernels::ActivationSums sums_;
  forward::ProductMeter products_;
};

}  // namespace nibble

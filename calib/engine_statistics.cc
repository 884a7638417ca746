#include "calib/engine_statistics.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "forward/buffer_pool.h"
#include "kernels/quant_types.h"

namespace nibble {

ActivationAccumulator::ActivationAccumulator(kernels::Backend& backend, int64_t K, int64_t gram_block)
    : backend_(&backend) {
  sums_.K = K;
  sums_.gram_block = gram_block;
}

void ActivationAccumulator::count_products(int64_t n, std::chrono::steady_clock::time_point t0) {
  const int64_t K = sums_.K, B = sums_.gram_block;
  for (int64_t b = 0; B && b < kernels::num_blocks(K, B); ++b) {
    const int64_t w = std::min(B, K - b * B);
    products_.flop += double(n) * double(w) * double(w + 1);
  }
  if (!B) products_.flop += double(n) * double(K) * double(K + 1);
  products_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ActivationAccumulator::add_rows(const float* x, int64_t rows, const int64_t* counted) {
  const int64_t K = sums_.K;
  int64_t n = rows;
  forward::Floats packed;  // the counted rows side by side, where a mask leaves gaps
  if (counted && std::count(counted, counted + rows, int64_t(0)) > 0) {
    packed.resize(size_t(rows * K));
    n = 0;
    for (int64_t r = 0; r < rows; ++r)
      if (counted[r]) std::copy_n(x + r * K, K, packed.data() + n++ * K);
    x = packed.data();
  }
  if (n == 0 && !sums_.gram.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Host rows (a forward run on the host: a graph input the engine captures) go up once per batch; on the
  // CPU nothing moves. The device's own forward hands its rows to add_device_rows instead.
  kernels::Tensor xt = kernels::host_view(DType::kFloat32, {n, K}, x);
  if (n > 0) xt = backend_->upload(xt);
  backend_->accumulate_statistics(xt, sums_);
  xt.release();  // before `packed` goes: a device may still read from it until the operation has waited
  count_products(n, t0);
}

void ActivationAccumulator::add_device_rows(const kernels::Tensor& x, DType round, int64_t rows,
                                            const std::vector<int64_t>* counted) {
  const auto t0 = std::chrono::steady_clock::now();
  kernels::Tensor xt = x;
  xt.shape = {rows, sums_.K};
  if (round != DType::kFloat32) xt = backend_->forward_round(xt, round);
  int64_t n = rows;
  if (counted && std::count(counted->begin(), counted->end(), int64_t(0)) > 0) {
    xt = backend_->forward_select_rows(xt, *counted);
    n = xt.shape[0];
  }
  if (n == 0 && !sums_.gram.empty()) return;
  backend_->accumulate_statistics(xt, sums_);
  count_products(n, t0);
}

MeasuredActivation ActivationAccumulator::finish() {
  if (sums_.gram.empty()) add_rows(nullptr, 0, nullptr);  // no counted row: zero statistics all the same
  MeasuredActivation m;
  m.K = sums_.K;
  m.rows = sums_.rows;
  m.gram_block = sums_.gram_block;
  m.packed = sums_.gram_block == 0;
  m.backend = backend_;
  const std::vector<uint8_t> raw = backend_->download(sums_.sum_abs);  // K values: host arithmetic reads them
  m.sum_abs.resize(size_t(m.K));
  std::memcpy(m.sum_abs.data(), raw.data(), raw.size());
  m.gram = std::move(sums_.gram);  // stays where it was accumulated
  if (m.gram_block) m.gram.shape = {kernels::num_blocks(m.K, m.gram_block), m.gram_block, m.gram_block};
  sums_ = {};
  return m;
}

}  // namespace nibble

#include "kernels/cpu/dequant_ref.h"

#include <stdexcept>

#include "kernels/dtype.h"

namespace nibble::kernels {

std::vector<uint8_t> dequantize_ref(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q,
                                    DType out) {
  const int64_t K = shape.K(), N = shape.N(), G = q.groups;
  const size_t n_el = size_t(shape.rows * shape.cols);
  if (q.codes.size() != n_el || q.scales.size() != size_t(G * N) || spec.block < 1 ||
      (spec.zero_point && q.zero_points.size() != q.scales.size()))
    throw std::invalid_argument("dequantize: codes, scales or zero points do not match the weight's shape");
  std::vector<uint8_t> bytes(n_el * dtype_size(out));
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = k / spec.block;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = shape.index(k, n), pi = shape.param_index(G, g, n);
      const int code = spec.zero_point ? int(q.codes[i]) - int(q.zero_points[pi]) : int(int8_t(q.codes[i]));
      store_float(out, bytes.data(), i, round_to(out, q.scales[pi] * float(code)));
    }
  }
  return bytes;
}

}  // namespace nibble::kernels

#include "kernels/cpu/search_ref.h"

#include <stdexcept>

#include "kernels/cpu/block_fit.h"

namespace nibble::kernels {
namespace {

// Runs `fit(values, n) -> BlockParams or fit::FloatZeroParams` on every block in order and writes the
// codes it implies.
template <class Fit>
void each_block(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out, const Fit& fit) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  const bool zp = spec.zero_point;
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  using Params = decltype(fit(static_cast<const float*>(nullptr), int64_t(0)));
  fit::size_params<Params>(out, G * N, zp);
  out.sq_error = 0;
  std::vector<float> v(static_cast<size_t>(bs));
  // The error summed per block, each column over its blocks, the columns in order: the CUDA backend's order.
  for (int64_t n = 0; n < N; ++n) {
    double column = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * bs, len = std::min(K, k0 + bs) - k0;
      for (int64_t k = 0; k < len; ++k) v[size_t(k)] = load_float(w.dtype, w.data, w.index(k0 + k, n));
      const Params p = fit(v.data(), len);
      fit::store_params(out, w.param_index(G, g, n), p, zp, spec.bits);
      double block = 0;
      for (int64_t k = 0; k < len; ++k) {
        const uint8_t c = fit::code_of(v[size_t(k)], p, spec.bits, zp, w.dtype);
        out.codes[w.index(k0 + k, n)] = c;
        const double d = double(v[size_t(k)]) - double(round_to(w.dtype, fit::value_of(c, p, spec.bits, zp)));
        block += d * d;
      }
      column += block;
    }
    out.sq_error += column;
  }
}

}  // namespace

void rtn_lsq_ref(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) {
  const DType st = scale_type(spec, w.dtype);
  each_block(w, spec, out, [&](const float* x, int64_t n) {
    return fit::lsq_block(x, n, spec.zero_point, spec.bits, w.dtype, st, opt);
  });
}

void hqq_ref(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) {
  if (!spec.zero_point) throw std::invalid_argument("hqq: needs zero points (spec.zero_point)");
  const DType st = scale_type(spec, w.dtype);
  fit::with_hqq_fit(spec.bits, w.dtype, st, opt, [&](const auto& block_fit) { each_block(w, spec, out, block_fit); });
}

}  // namespace nibble::kernels

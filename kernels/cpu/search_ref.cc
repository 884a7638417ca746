#include "kernels/cpu/search_ref.h"

#include <stdexcept>

#include "kernels/cpu/block_fit.h"

namespace nibble::kernels {
namespace {

// Runs `fit(values, n) -> BlockParams` on every block in order and writes the RTN codes it implies.
template <class Fit>
void each_block(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out, const Fit& fit) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  const bool zp = spec.zero_point;
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.assign(zp ? size_t(G * N) : 0, 0);
  out.sq_error = 0;
  std::vector<float> v(static_cast<size_t>(bs));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * bs, len = std::min(K, k0 + bs) - k0;
      for (int64_t k = 0; k < len; ++k) v[size_t(k)] = load_float(w.dtype, w.data, w.index(k0 + k, n));
      const BlockParams p = fit(v.data(), len);
      out.scales[w.param_index(G, g, n)] = p.scale;
      if (zp) out.zero_points[w.param_index(G, g, n)] = p.zero_point;
      for (int64_t k = 0; k < len; ++k) {
        const uint8_t c = quantize_value(v[size_t(k)], p, spec.bits, zp, w.dtype);
        out.codes[w.index(k0 + k, n)] = c;
        const double d = double(v[size_t(k)]) - double(round_to(w.dtype, dequantize_value(c, p, spec.bits, zp)));
        out.sq_error += d * d;
      }
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
  each_block(w, spec, out, [&](const float* x, int64_t n) { return fit::hqq_block(x, n, spec.bits, w.dtype, st, opt); });
}

}  // namespace nibble::kernels

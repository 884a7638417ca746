#include "kernels/cpu/search_fast.h"

#include <stdexcept>

#include "kernels/cpu/block_fit.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

constexpr int64_t kChannelsPerPanel = 32;

// Panels of output channels in parallel; within a panel, each block row is gathered for all its
// channels at once (one pass over contiguous rows of a [K, N] weight), then fitted channel by channel.
// The error is summed per block, each channel over its blocks and the channels in order (the reference's
// and the CUDA backend's order), so the total does not depend on the thread count.
template <class Fit>
void each_block_parallel(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out, const Fit& fit) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  const bool zp = spec.zero_point;
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  using Params = decltype(fit(static_cast<const float*>(nullptr), int64_t(0)));
  fit::size_params<Params>(out, G * N, zp);
  const int64_t panels = num_blocks(N, kChannelsPerPanel);
  std::vector<std::vector<double>> err(static_cast<size_t>(panels));
  parallel_for(panels, [&](int64_t pi) {
    const int64_t n0 = pi * kChannelsPerPanel, width = std::min(N, n0 + kChannelsPerPanel) - n0;
    std::vector<float> buf(static_cast<size_t>(width * bs));
    std::vector<double>& e = err[size_t(pi)];
    e.assign(size_t(width * G), 0.0);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * bs, len = std::min(K, k0 + bs) - k0;
      for (int64_t k = 0; k < len; ++k)
        for (int64_t j = 0; j < width; ++j) buf[size_t(j * bs + k)] = load_float(w.dtype, w.data, w.index(k0 + k, n0 + j));
      for (int64_t j = 0; j < width; ++j) {
        const float* x = buf.data() + j * bs;
        const Params p = fit(x, len);
        fit::store_params(out, w.param_index(G, g, n0 + j), p, zp, spec.bits);
        double s = 0;
        for (int64_t k = 0; k < len; ++k) {
          const uint8_t c = fit::code_of(x[k], p, spec.bits, zp, w.dtype);
          out.codes[w.index(k0 + k, n0 + j)] = c;
          const double d = double(x[k]) - double(round_to(w.dtype, fit::value_of(c, p, spec.bits, zp)));
          s += d * d;
        }
        e[size_t(j * G + g)] = s;
      }
    }
  });
  out.sq_error = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double* e = err[size_t(n / kChannelsPerPanel)].data() + (n % kChannelsPerPanel) * G;
    double column = 0;
    for (int64_t g = 0; g < G; ++g) column += e[g];
    out.sq_error += column;
  }
}

}  // namespace

void rtn_lsq_fast(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) {
  const DType st = scale_type(spec, w.dtype);
  each_block_parallel(w, spec, out, [&](const float* x, int64_t n) {
    return fit::lsq_block(x, n, spec.zero_point, spec.bits, w.dtype, st, opt);
  });
}

void hqq_fast(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) {
  if (!spec.zero_point) throw std::invalid_argument("hqq: needs zero points (spec.zero_point)");
  const DType st = scale_type(spec, w.dtype);
  fit::with_hqq_fit(spec.bits, w.dtype, st, opt,
                    [&](const auto& block_fit) { each_block_parallel(w, spec, out, block_fit); });
}

}  // namespace nibble::kernels

#include "kernels/cpu/gptq_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/gptq_channels.h"

namespace nibble::kernels {

std::vector<double> gptq_prepare_hessian(const double* gram, int64_t K, const float* inv_s, bool act_order,
                                         GptqFactor& f) {
  gptq_channels(gram, K, inv_s, act_order, f);
  std::vector<double> h(size_t(K * K));
  for (int64_t i = 0; i < K; ++i) {
    const int64_t a = f.perm[size_t(i)];
    const double sa = inv_s ? double(inv_s[a]) : 1.0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t b = f.perm[size_t(j)];
      const double sb = inv_s ? double(inv_s[b]) : 1.0;
      // A dead channel is decoupled from the rest, with a unit diagonal (its weight is zeroed).
      const bool dead = f.dead[size_t(a)] || f.dead[size_t(b)];
      h[size_t(i * K + j)] = dead ? (a == b ? 1.0 : 0.0) : gram[a * K + b] * sa * sb;
    }
  }
  return h;
}

double gptq_damp(const std::vector<double>& h, int64_t K, double percdamp, int attempt) {
  std::vector<double> diag(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) diag[size_t(k)] = h[size_t(k * K + k)];
  return gptq_damp_of(diag, percdamp, attempt);
}

namespace {

// Lower Cholesky factor in place (row-major, A = L Lᵀ); false when A is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t K) {
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      double s = a[size_t(i * K + j)];
      for (int64_t t = 0; t < j; ++t) s -= a[size_t(i * K + t)] * a[size_t(j * K + t)];
      if (i == j) {
        if (!(s > 0)) return false;
        a[size_t(i * K + i)] = std::sqrt(s);
      } else {
        a[size_t(i * K + j)] = s / a[size_t(j * K + j)];
      }
    }
    for (int64_t j = i + 1; j < K; ++j) a[size_t(i * K + j)] = 0;
  }
  return true;
}

// H⁻¹ = L⁻ᵀ L⁻¹ from the lower factor L of H.
std::vector<double> inverse_from_lower(const std::vector<double>& l, int64_t K) {
  std::vector<double> li(size_t(K * K), 0.0);  // L⁻¹, lower
  for (int64_t c = 0; c < K; ++c) {
    li[size_t(c * K + c)] = 1.0 / l[size_t(c * K + c)];
    for (int64_t i = c + 1; i < K; ++i) {
      double s = 0;
      for (int64_t t = c; t < i; ++t) s += l[size_t(i * K + t)] * li[size_t(t * K + c)];
      li[size_t(i * K + c)] = -s / l[size_t(i * K + i)];
    }
  }
  std::vector<double> inv(size_t(K * K));
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (int64_t t = i; t < K; ++t) s += li[size_t(t * K + i)] * li[size_t(t * K + j)];
      inv[size_t(i * K + j)] = inv[size_t(j * K + i)] = s;
    }
  return inv;
}

}  // namespace

GptqFactor gptq_factor_ref(const double* gram, int64_t K, const float* inv_s, double percdamp, bool act_order) {
  GptqFactor f;
  const std::vector<double> h = gptq_prepare_hessian(gram, K, inv_s, act_order, f);
  for (int attempt = 0; attempt < 5; ++attempt) {
    f.damp = gptq_damp(h, K, percdamp, attempt);
    std::vector<double> a = h;
    for (int64_t k = 0; k < K; ++k) a[size_t(k * K + k)] += f.damp;
    if (!cholesky_lower(a, K)) continue;
    std::vector<double> inv = inverse_from_lower(a, K);
    // H⁻¹ = L2 L2ᵀ = UᵀU with U = L2ᵀ.
    if (!cholesky_lower(inv, K)) continue;
    std::vector<float> u(size_t(K * K), 0.0f);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i; j < K; ++j) u[size_t(i * K + j)] = float(inv[size_t(j * K + i)]);
    f.upper = host_tensor(DType::kFloat32, {K, K}, std::move(u));
    return f;
  }
  throw std::runtime_error("GPTQ: the Gram matrix (K = " + std::to_string(K) +
                           ") is not positive definite even with 10^4 times the dampening");
}

BlockParams gptq_block_params(const float* v, const float* weight, int64_t n, bool partial, const QuantSpec& spec,
                              DType st, const GptqOptions& opt) {
  const bool zp = spec.zero_point;
  float amax = 0, mn = partial ? 0.0f : INFINITY, mx = partial ? 0.0f : -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    amax = std::max(amax, std::fabs(v[t]));
    mn = std::min(mn, v[t]);
    mx = std::max(mx, v[t]);
  }
  const size_t R = opt.ratios.size(), C = R * ((zp || !opt.both_signs) ? 1 : 2);
  BlockParams best = zp ? block_params_zero_point(mn, mx, spec.bits, st) : block_params_symmetric(amax, spec.bits, st);
  double best_err = INFINITY;
  for (size_t c = 0; c < C; ++c) {
    const BlockParams p = clip_candidate(opt.ratios, int64_t(c), amax, mn, mx, spec.bits, zp, st);
    double err = 0;
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t q = quantize_value(v[t], p, spec.bits, zp, DType::kFloat32);
      const double d = double(v[t]) - double(round_to(st, dequantize_value(q, p, spec.bits, zp)));
      err += double(weight[t]) * d * d;
    }
    if (err < best_err) {
      best_err = err;
      best = p;
    }
  }
  return best;
}

void gptq_quantize_ref(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                       QuantResult& out) {
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  if (f.K != K) throw std::invalid_argument("gptq_quantize: factor of K = " + std::to_string(f.K));
  if (!f.upper.data || f.upper.elements() != K * K) throw std::invalid_argument("gptq_quantize: a factor without U on the host");
  const bool zp = spec.zero_point;
  const DType st = scale_type(spec, w.dtype);
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.assign(zp ? size_t(G * N) : 0, 0);
  std::vector<int64_t> pos(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) pos[size_t(f.perm[size_t(i)])] = i;
  std::vector<double> wp(size_t(K * N));  // the working weight, rows in sweep order
  for (int64_t i = 0; i < K; ++i) {
    const int64_t k = f.perm[size_t(i)];
    for (int64_t n = 0; n < N; ++n) wp[size_t(i * N + n)] = f.dead[size_t(k)] ? 0.0 : load_float(w.dtype, w.data, w.index(k, n));
  }
  std::vector<BlockParams> params(size_t(G * N));
  std::vector<uint8_t> fixed(size_t(G), 0);
  std::vector<float> v(static_cast<size_t>(bs));
  out.sq_error = 0;
  for (int64_t i = 0; i < K; ++i) {
    const int64_t k = f.perm[size_t(i)], g = k / bs, k0 = g * bs, k1 = std::min(K, k0 + bs);
    if (!fixed[size_t(g)]) {
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t t = k0; t < k1; ++t) v[size_t(t - k0)] = float(wp[size_t(pos[size_t(t)] * N + n)]);
        const BlockParams p = gptq_block_params(v.data(), f.energy.data() + k0, k1 - k0, k1 - k0 < bs, spec, st, opt);
        params[size_t(g * N + n)] = p;
        out.scales[w.param_index(G, g, n)] = p.scale;
        if (zp) out.zero_points[w.param_index(G, g, n)] = p.zero_point;
      }
      fixed[size_t(g)] = 1;
    }
    const float* U = f.upper.f32();
    const double d = double(U[size_t(i * K + i)]);
    for (int64_t n = 0; n < N; ++n) {
      const BlockParams& p = params[size_t(g * N + n)];
      const double x = wp[size_t(i * N + n)];
      const uint8_t c = quantize_value(float(x), p, spec.bits, zp, DType::kFloat32);
      const double deq = double(round_to(st, dequantize_value(c, p, spec.bits, zp)));
      out.codes[w.index(k, n)] = c;
      const double e = double(load_float(w.dtype, w.data, w.index(k, n))) - deq;
      out.sq_error += e * e;
      const double err = (x - deq) / d;
      for (int64_t j = i + 1; j < K; ++j) wp[size_t(j * N + n)] -= double(U[size_t(i * K + j)]) * err;
    }
  }
}

}  // namespace nibble::kernels

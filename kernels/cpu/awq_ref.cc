#include "kernels/cpu/awq_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>

#include "kernels/backend.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

float pairwise(const float* a, int64_t n) {
  if (n < 8) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

// numpy's x ** a for a float32 array and a Python float: fast paths for 0, 0.5 and 1.
inline float np_pow(float x, float a) {
  if (a == 0.0f) return 1.0f;
  if (a == 0.5f) return std::sqrt(x);
  if (a == 1.0f) return x;
  return std::pow(x, a);
}

}  // namespace

float numpy_sum_f32(const float* a, int64_t n) { return pairwise(a, n); }

std::vector<float> logical_weight(const WeightMatrix& w) {
  const int64_t K = w.K(), N = w.N();
  std::vector<float> out(size_t(K * N));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      out[size_t(k * N + n)] = load_float(w.dtype, w.data, w.index(k, n));
  return out;
}

std::vector<float> weight_mean(const std::vector<float>& w, int64_t K, int64_t N, int64_t block, bool contiguous) {
  const int64_t G = (K + block - 1) / block, Kp = G * block;
  const float tiny = FLT_MIN;
  // amax per group: ModelOpt views the zero-padded [Kp, N] array as [block, Kp*N/block] and takes
  // the max over axis 0, so element (k, n) belongs to column (k*N + n) % M of that view.
  const int64_t M = Kp * N / block;
  std::vector<float> amax(size_t(contiguous ? G * N : M), 0.0f);
  auto group = [&](int64_t k, int64_t n) -> int64_t {
    return contiguous ? (k / block) * N + n : (k * N + n) % M;
  };
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      float& a = amax[size_t(group(k, n))];
      a = std::max(a, std::fabs(w[size_t(k * N + n)]));
    }
  std::vector<float> out(static_cast<size_t>(K)), row(static_cast<size_t>(N));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n)
      row[size_t(n)] = std::fabs(w[size_t(k * N + n)]) / (amax[size_t(group(k, n))] + tiny);
    out[size_t(k)] = pairwise(row.data(), N) / float(N);
  }
  return out;
}

std::vector<float> weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block) {
  if (siblings.empty()) return {};
  const int64_t K = siblings[0].K();
  int64_t NT = 0;
  for (const auto& w : siblings) NT += w.N();
  if ((K * NT) % block != 0) throw std::invalid_argument("weight_mean_joint: K * sum N is not a multiple of the block");
  std::vector<float> wc(size_t(K * NT));  // the siblings side by side, [K, NT]
  int64_t n0 = 0;
  for (const auto& w : siblings) {
    const std::vector<float> kn = logical_weight(w);
    for (int64_t k = 0; k < K; ++k) std::copy_n(kn.begin() + k * w.N(), w.N(), wc.begin() + k * NT + n0);
    n0 += w.N();
  }
  const int64_t M = K * NT / block;
  std::vector<float> amax(static_cast<size_t>(M), 0.0f), row(static_cast<size_t>(NT)), out(static_cast<size_t>(K));
  for (int64_t f = 0; f < K * NT; ++f) amax[size_t(f % M)] = std::max(amax[size_t(f % M)], std::fabs(wc[size_t(f)]));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < NT; ++n)
      row[size_t(n)] = std::fabs(wc[size_t(k * NT + n)]) / (amax[size_t((k * NT + n) % M)] + 1e-6f);
    out[size_t(k)] = pairwise(row.data(), NT) / float(NT);
  }
  return out;
}

std::vector<float> awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean, double alpha) {
  const float a = float(alpha), b = float(1.0 - alpha);
  const size_t K = x_mean.size();
  std::vector<float> s(K);
  for (size_t k = 0; k < K; ++k) {
    const float v = np_pow(x_mean[k], a) / (np_pow(w_mean[k], b) + FLT_MIN);
    s[k] = std::min(std::max(v, 1e-4f), 1e4f);
  }
  const float mx = *std::max_element(s.begin(), s.end()), mn = *std::min_element(s.begin(), s.end());
  const float norm = std::sqrt(mx * mn);
  for (auto& v : s) v /= norm;
  return s;
}

std::vector<uint8_t> scale_weight(const WeightMatrix& w, const float* s) {
  const int64_t K = w.K(), N = w.N();
  std::vector<uint8_t> out(size_t(K * N) * dtype_size(w.dtype));
  parallel_for(w.rows, [&](int64_t r) {
    for (int64_t c = 0; c < w.cols; ++c) {
      const size_t i = size_t(r * w.cols + c);
      const float sk = s[w.k_axis == 0 ? r : c];
      store_float(w.dtype, out.data(), i, round_to(w.dtype, load_float(w.dtype, w.data, i) * sk));
    }
  });
  return out;
}

std::vector<uint8_t> scale_weight_f32(const WeightMatrix& w, const float* s) {
  std::vector<uint8_t> out(size_t(w.rows * w.cols) * sizeof(float));
  float* o = reinterpret_cast<float*>(out.data());
  parallel_for(w.rows, [&](int64_t r) {
    for (int64_t c = 0; c < w.cols; ++c) {
      const size_t i = size_t(r * w.cols + c);
      o[i] = load_float(w.dtype, w.data, i) * s[w.k_axis == 0 ? r : c];
    }
  });
  return out;
}

}  // namespace nibble::kernels

namespace nibble::kernels {

std::vector<uint8_t> divide_columns(const WeightMatrix& w, const float* d) {
  const DType t = w.dtype;
  std::vector<uint8_t> out(size_t(w.rows * w.cols) * dtype_size(t));
  parallel_for(w.K(), [&](int64_t k) {
    for (int64_t n = 0; n < w.N(); ++n) {
      const size_t i = w.index(k, n);
      store_float(t, out.data(), i, round_to(t, load_float(t, w.data, i) / round_to(t, d[n])));
    }
  });
  return out;
}

std::vector<float> channel_energy(const double* gram, int64_t K, const float* s) {
  std::vector<float> e(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k)
    e[size_t(k)] = s ? float(gram[k * K + k] / (double(s[k]) * double(s[k]))) : float(gram[k * K + k]);
  return e;
}

std::vector<float> gram_cholesky_upper_ref(const double* gram, int64_t K) {
  double dmax = 0;
  for (int64_t k = 0; k < K; ++k) dmax = std::max(dmax, gram[k * K + k]);
  if (!(dmax > 0) || !std::isfinite(dmax)) return {};
  std::vector<double> u(size_t(K * K));
  for (double shift : kCholeskyShifts) {
    // Row by row: U_ii = sqrt(G_ii - Σ_m<i U_mi²), U_ij = (G_ij - Σ_m<i U_mi U_mj) / U_ii.
    std::fill(u.begin(), u.end(), 0.0);
    bool ok = true;
    for (int64_t i = 0; i < K && ok; ++i) {
      double dii = gram[i * K + i] + shift * dmax;
      for (int64_t m = 0; m < i; ++m) dii -= u[size_t(m * K + i)] * u[size_t(m * K + i)];
      if (!(dii > 0)) {
        ok = false;
        break;
      }
      const double uii = std::sqrt(dii);
      u[size_t(i * K + i)] = uii;
      for (int64_t j = i + 1; j < K; ++j) {
        double v = gram[i * K + j];
        for (int64_t m = 0; m < i; ++m) v -= u[size_t(m * K + i)] * u[size_t(m * K + j)];
        u[size_t(i * K + j)] = v / uii;
      }
    }
    if (ok) return std::vector<float>(u.begin(), u.end());
  }
  return {};
}

LossWeight loss_weight(const WeightMatrix& w, const float* s, const QuantSpec& spec, const float* gram32,
                       bool clip) {
  const int64_t K = w.K();
  LossWeight l;
  l.w = w;
  l.spec = spec;
  if (clip) {  // W ⊙ s in fp32, scales rounded to the weight dtype, per-block clip ratio
    l.energy.resize(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) l.energy[size_t(k)] = gram32[k * K + k] / (s[k] * s[k]);
    l.bytes = scale_weight_f32(w, s);
    l.w.dtype = DType::kFloat32;
    l.spec.scale_dtype = w.dtype;
  } else {
    l.bytes = scale_weight(w, s);
  }
  l.w.data = l.bytes.data();
  return l;
}

std::vector<float> loss_residual(const LossWeight& l, const QuantResult& q, const std::vector<float>& w_kn,
                                 const float* s) {
  const int64_t K = l.w.K(), N = l.w.N();
  std::vector<float> d(size_t(K * N));
  parallel_for(K, [&](int64_t k) {
    for (int64_t n = 0; n < N; ++n) {
      const size_t pi = l.w.param_index(q.groups, k / l.spec.block, n), ci = l.w.index(k, n);
      const int code = l.spec.zero_point ? int(q.codes[ci]) - int(q.zero_points[pi]) : int(int8_t(q.codes[ci]));
      const float deq = round_to(l.w.dtype, float(code) * q.scales[pi]);
      d[size_t(k * N + n)] = w_kn[size_t(k * N + n)] - deq / s[k];
    }
  });
  return d;
}

double awq_loss_ref(const WeightMatrix& w, const float* s, const QuantSpec& spec, const float* gram32, int64_t rows,
                    const std::vector<float>* clip_ratios) {
  const int64_t K = w.K(), N = w.N();
  const LossWeight l = loss_weight(w, s, spec, gram32, clip_ratios != nullptr);
  QuantResult q;
  if (clip_ratios) rtn_quantize_weighted(l.w, l.spec, l.energy.data(), *clip_ratios, q);
  else rtn_quantize_ref(l.w, l.spec, q);
  // D = W - Ŵ / s (logical [K, N]); loss = Σ_n dₙᵀ G dₙ in float64.
  const std::vector<float> df = loss_residual(l, q, logical_weight(w), s);
  const std::vector<double> d(df.begin(), df.end());
  double sum = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < K; ++i) {
      double gd = 0;
      for (int64_t j = 0; j < K; ++j) gd += double(gram32[i * K + j]) * d[size_t(j * N + n)];
      sum += d[size_t(i * N + n)] * gd;
    }
  return sum / (double(rows) * double(N));
}

}  // namespace nibble::kernels

// GPTQ's per-channel bookkeeping, O(K) on the host, shared by every backend so that they all sweep in
// the same order with the same dampening: the energies, dead channels and sweep order of a factor, and
// the diagonal of H in sweep order (what the dampening is a fraction of). The K x K work (building H,
// the factorisations) is each backend's own (kernels/cpu/gptq_*.cc, kernels/cuda/backend_gptq.cu).
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/backend.h"

namespace nibble::kernels {

// Fills f.K, f.energy, f.dead and f.perm from a float64 Gram matrix (K x K row-major) scaled by inv_s on
// both sides (null: 1); returns diag(H) in sweep order: a dead channel's is 1 (it is decoupled).
// `stride`: between two diagonal elements in `gram` (K + 1 in the matrix; 1 for its diagonal alone).
inline std::vector<double> gptq_channels(const double* gram, int64_t K, const float* inv_s, bool act_order,
                                         GptqFactor& f, int64_t stride = -1) {
  if (stride < 0) stride = K + 1;
  f.K = K;
  f.energy.assign(size_t(K), 0.0f);
  f.dead.assign(size_t(K), 0);
  std::vector<double> d(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    const double s = inv_s ? double(inv_s[k]) : 1.0;
    d[size_t(k)] = gram[k * stride] * s * s;
    f.energy[size_t(k)] = float(d[size_t(k)]);
    f.dead[size_t(k)] = !(d[size_t(k)] > 0);
  }
  f.perm.resize(size_t(K));
  std::iota(f.perm.begin(), f.perm.end(), int64_t(0));
  // Channels with the most energy first: their errors are compensated by the most channels.
  if (act_order)
    std::stable_sort(f.perm.begin(), f.perm.end(), [&](int64_t a, int64_t b) { return d[size_t(a)] > d[size_t(b)]; });
  std::vector<double> diag(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) {
    const int64_t k = f.perm[size_t(i)];
    diag[size_t(i)] = f.dead[size_t(k)] ? 1.0 : d[size_t(k)];
  }
  return diag;
}

// percdamp * mean(diag H), then 10x more per attempt (at least 1e-6 of the mean): attempt 0..4. The mean
// is summed in sweep order.
inline double gptq_damp_of(const std::vector<double>& diag, double percdamp, int attempt) {
  double mean = 0;
  for (double v : diag) mean += v;
  mean /= double(diag.size());
  double d = percdamp * mean;
  for (int a = 0; a < attempt; ++a) d = std::max(d * 10.0, 1e-6 * mean);
  return d;
}

// Sweep position of each channel (the inverse of f.perm).
inline std::vector<int64_t> gptq_positions(const GptqFactor& f) {
  std::vector<int64_t> pos(f.perm.size());
  for (size_t i = 0; i < f.perm.size(); ++i) pos[size_t(f.perm[i])] = int64_t(i);
  return pos;
}

}  // namespace nibble::kernels

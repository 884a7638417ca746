// Kernel bodies of nibble's Gram-form clip search (clip_quantize_gram), arranged as a GPU wants it and
// as the CPU's fast version computes it: per candidate, every block's residuals D (one thread per
// element), then E = G_bb · D_b for all blocks in one strided-batched sgemm, then each block's loss
// Σ d ⊙ e in double (one thread per (block, column)), keeping the best candidate. The residuals are
// the reference's bit for bit; the losses differ from its float64 products only in the float sgemm.
// D and E are the panel's logical [G·block, width] row-major arrays; rows past K stay zero.
#pragma once
#include "kernels/cuda/rtn_kernels.h"

namespace nibble::kernels::gpu {

// The range of block (g, n) that the candidates scale, one thread per (g, n): [G, width].
struct ClipRangeBody {
  WeightView w;
  BlockShape s;
  BlockRange* range;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    range[i] = block_range(w, k0, k1, n, (k1 - k0) < s.block);
  }
};

// d(k, n) = w - ŵ for candidate ci of the block of row k, one thread per element of [K, width].
struct ClipResidualBody {
  WeightView w;
  BlockShape s;
  const BlockRange* range;
  const float* ratios;
  int64_t R, ci;
  float* d;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), k = i / N, n = i % N;
    const BlockRange b = range[(k / s.block) * N + n];
    const hd::Params p = candidate(ratios, R, ci, b.amax, b.mn, b.mx, s);
    const float v = w.at(k, n);
    d[i] = v -
           hd::round_to(w.dtype, hd::dequantize(hd::quantize(v, p, s.bits, s.zero_point, w.dtype), p, s.zero_point));
  }
};

// Loss of candidate ci for block (g, n) = Σ_a d·e over the block's rows in ascending order, in double;
// the best so far is kept (candidate 0 when no loss is below +inf: a NaN or inf in the Gram block).
struct ClipLossBody {
  int64_t K, N, block, ci;
  const float* d;
  const float* e;
  double* best_loss;
  int* best_ci;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t g = i / N, n = i % N, k0 = g * block, kn = k0 + block < K ? block : K - k0;
    double loss = 0;
    for (int64_t a = 0; a < kn; ++a) {
      const int64_t at = (k0 + a) * N + n;
      loss += double(d[at]) * double(e[at]);
    }
    double prev = ci == 0 ? INFINITY : best_loss[i];
    int bc = ci == 0 ? 0 : best_ci[i];
    if (loss < prev) {
      prev = loss;
      bc = int(ci);
    }
    best_loss[i] = prev;
    best_ci[i] = bc;
  }
};

// Codes, scale and zero point of block (g, n) with its best candidate.
struct ClipWriteBody {
  WeightView w;
  BlockShape s;
  QuantOut o;
  const BlockRange* range;
  const float* ratios;
  int64_t R;
  const int* best_ci;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), K = w.K(), G = (K + s.block - 1) / s.block, g = i / N, n = i % N;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    const BlockRange b = range[i];
    const hd::Params p = candidate(ratios, R, best_ci[i], b.amax, b.mn, b.mx, s);
    store_params(w, s, o, G, g, n, p, write_block(w, s, k0, k1, n, p, o.codes));
  }
};

}  // namespace nibble::kernels::gpu

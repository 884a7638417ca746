// Kernel bodies of ModelOpt mode's clip search (clip_search_modelopt, clip_ref.cc) and of the sibling
// weights' joint statistic's layout (awq_weight_mean_joint; its reductions are awq_kernels.h's).
//
// The clip search's arithmetic is the CPU's, operation for operation: per block g, token t and column
// n the partial product Σ_i x[t, gB+i] w[gB+i, n] is a float32 mul-then-add chain, i ascending (numpy's
// order when the chunk has a column axis), and the loss Σ_t (P_ref - P_r)² a chain t ascending. That is
// why these are kernels and not a batched GEMM: cuBLAS and OpenBLAS block the K loop and fuse
// multiply-adds, so a GEMM's partial products differ from the chain in their last bits, the losses with
// them, and a near tie between two ratios would then pick another ratio (other nibble codes). A chunk of
// one column (numpy's pairwise sums) runs the `...PairwiseBody` versions.
//
// Arrays of a column panel of width W (n the panel's column, fastest: a warp reads consecutive columns):
//   wq   [(R + 1) * G * B, W]: candidate r's dequantized weight ŵ_r (s = r < R), the weight itself
//        (s = R), row (s * G + g) * B + i, zero past K (ModelOpt pads K to G * B)
//   ref  [G * T, W]: P_ref of block g and token t at row g * T + t
//   loss [R * G, W]: Σ_t (P_ref - P_r)² at row r * G + g
#pragma once
#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/rtn_kernels.h"

namespace nibble::kernels::gpu {

// The weight and its R candidates, one thread per (s, g, n) of [(R + 1) * G, W]: the block's amax, then
// ModelOpt's quant_tensor(W, block, alpha = r) dequantized and rounded to the weight dtype, as
// clip_search_modelopt's `wq` (ratios already rounded to the weight dtype).
struct MoClipCandidatesBody {
  WeightView w;
  int bits;
  int64_t B, R;
  const float* ratios;
  float* wq;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t W = w.N(), K = w.K(), G = (K + B - 1) / B, n = idx % W, sg = idx / W, g = sg % G, s = sg / G;
    const int64_t k0 = g * B, kn = k0 + B < K ? B : K - k0;
    const int dt = w.dtype;
    float* out = wq + sg * B * W + n;
    if (s == R) {
      for (int64_t i = 0; i < B; ++i) out[i * W] = i < kn ? w.at(k0 + i, n) : 0.0f;
      return;
    }
    float amax = 0.0f;
    for (int64_t i = 0; i < kn; ++i) amax = hd::max(amax, hd::fabs(w.at(k0 + i, n)));
    // ModelOpt's step, not clip_candidate: the ratio and r·amax are rounded to the weight dtype (numpy).
    const hd::Params p = hd::params_symmetric(hd::round_to(dt, amax * ratios[s]), bits, dt);
    for (int64_t i = 0; i < B; ++i)
      out[i * W] = i < kn ? hd::round_to(dt, hd::dequantize(hd::quantize(w.at(k0 + i, n), p, bits, false, dt), p, false))
                          : 0.0f;
  }
};

// The token rows x [T, K] and wq, as the products of a block read them: x past K is the zero padding.
struct MoClipOperands {
  const float* x;
  int64_t T, K, B, G, R, W;
  const float* wq;
  NIBBLE_HD float xv(int64_t t, int64_t k) const { return k < K ? x[t * K + k] : 0.0f; }
  // Slice s (a candidate, or the weight at s = R) of block g, at column n.
  NIBBLE_HD const float* slice(int64_t s, int64_t g, int64_t n) const { return wq + (s * G + g) * B * W + n; }
  NIBBLE_HD int64_t rows(int64_t g) const { return g * B + B < K ? B : K - g * B; }
};

// Σ_{i<kn} x[i] · w[i · W], float32, i ascending: numpy's order for a chunk with a column axis. (The CPU
// also adds the padded rows' +0 products: they change no square of the loss.)
NIBBLE_HD inline float mo_block_dot(const float* x, int64_t kn, const float* w, int64_t W) {
  float acc = 0.0f;
  for (int64_t i = 0; i < kn; ++i) acc += x[i] * w[i * W];
  return acc;
}

// Product i of token t with a block's slice over the whole padded block, for numpy's pairwise sum.
struct MoPaddedProduct {
  const MoClipOperands* o;
  int64_t t, k0;
  const float* w;
  NIBBLE_HD float operator()(int64_t i) const { return o->xv(t, k0 + i) * w[i * o->W]; }
};

// P_ref of (g, t, n), one thread each over [G * T, cols] of the panel's columns [c0, c0 + cols).
struct MoClipRefBody {
  MoClipOperands o;
  int64_t c0, cols;
  float* ref;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t n = c0 + idx % cols, gt = idx / cols, g = gt / o.T, t = gt % o.T;
    ref[gt * o.W + n] = mo_block_dot(o.x + t * o.K + g * o.B, o.rows(g), o.slice(o.R, g, n), o.W);
  }
};
// The same for a chunk of one column: the block's pairwise sum over its B padded products.
struct MoClipRefPairwiseBody {
  MoClipOperands o;
  int64_t c0, cols;
  float* ref;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t n = c0 + idx % cols, gt = idx / cols, g = gt / o.T, t = gt % o.T;
    ref[gt * o.W + n] = numpy_sum(MoPaddedProduct{&o, t, g * o.B, o.slice(o.R, g, n)}, 0, o.B);
  }
};

// Σ_t (P_ref - P_r)² of (r, g, n), t ascending, one thread each over [R * G, cols].
struct MoClipLossBody {
  MoClipOperands o;
  int64_t c0, cols;
  const float* ref;
  float* loss;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t n = c0 + idx % cols, rg = idx / cols, g = rg % o.G, r = rg / o.G, kn = o.rows(g);
    const float* w = o.slice(r, g, n);
    const float* x = o.x + g * o.B;
    const float* pr = ref + g * o.T * o.W + n;
    float acc = 0.0f;
    for (int64_t t = 0; t < o.T; ++t) {
      const float d = pr[t * o.W] - mo_block_dot(x + t * o.K, kn, w, o.W);
      acc += d * d;
    }
    loss[rg * o.W + n] = acc;
  }
};
// The same for a chunk of one column: pairwise block sums, and with a single block (G = 1) numpy's
// pairwise token mean too.
struct MoClipLossPairwiseBody {
  MoClipOperands o;
  int64_t c0, cols;
  const float* ref;
  float* loss;
  struct Square {  // (P_ref - P_r)² of token t
    const MoClipLossPairwiseBody* b;
    int64_t g, n, r;
    NIBBLE_HD float operator()(int64_t t) const {
      const MoClipOperands& o = b->o;
      const float d = b->ref[(g * o.T + t) * o.W + n] - numpy_sum(MoPaddedProduct{&o, t, g * o.B, o.slice(r, g, n)}, 0, o.B);
      return d * d;
    }
  };
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t n = c0 + idx % cols, rg = idx / cols, g = rg % o.G, r = rg / o.G;
    const Square sq{this, g, n, r};
    float acc = 0.0f;
    if (o.G == 1) acc = numpy_sum(sq, 0, o.T);
    else
      for (int64_t t = 0; t < o.T; ++t) acc += sq(t);
    loss[rg * o.W + n] = acc;
  }
};

// The chosen ratio of block (g, n), one thread each over [G, W]: np.mean (the float32 sum over the
// float64 count, stored as float32), the first strictly smaller loss in the ratios' order, 1.0 when none
// is below +inf. Written at n * G + g, ModelOpt's best_alpha layout.
struct MoClipPickBody {
  const float* loss;
  const float* ratios;
  int64_t R, G, W, T;
  float* choice;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t n = idx % W, g = idx / W;
    float best_loss = INFINITY, best = 1.0f;
    for (int64_t r = 0; r < R; ++r) {
      const float m = float(double(loss[(r * G + g) * W + n]) / double(T));
      if (m < best_loss) {
        best_loss = m;
        best = ratios[r];
      }
    }
    choice[n * G + g] = best;
  }
};

// One sibling into the siblings side by side ([K, NT] row-major, columns [c0, c0 + N) of it), in the
// siblings' common dtype (exact) or float32: one thread per element of the sibling's logical [K, N].
struct SideBySideBody {
  WeightView w;
  int64_t c0, NT;
  int dtype;
  void* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t N = w.N(), k = i / N, n = i % N;
    hd::store(dtype, out, k * NT + c0 + n, w.at(k, n));
  }
};

}  // namespace nibble::kernels::gpu

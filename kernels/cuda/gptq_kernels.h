// Kernel bodies of GPTQ on the device (backend_gptq.cu), each the CPU fast kernel's arithmetic
// (kernels/cpu/gptq_fast.cc) with the same operations in the same order, so that the emulated device
// gives its bits:
//  - the factor: H in sweep order, scaled, dead channels decoupled and the dampening added, built from
//    row panels of the Gram matrix (gptq_prepare_hessian then `a[kk] += damp`); the upper triangle
//    copied from the lower between dpotri and the second dpotrf, as the CPU does;
//  - the sweep of one lazy batch, one thread per output column (the CPU's loop over a chunk's columns):
//    a block's parameters fixed when the sweep first reaches one of its channels (fix_block,
//    gptq_block_params), quantize, the scaled error, the in-batch compensation. The trailing update
//    of the later rows is LinAlg's sgemm, the squared errors are summed per 128-column chunk in the
//    CPU's order (GptqChunkErrorBody).
#pragma once
#include "kernels/cuda/rtn_kernels.h"

namespace nibble::kernels::gpu {

// ---- The factor

// Rows [r0, r0 + rows) of the Gram matrix (staged on the device, K each) into H (K x K, row-major, sweep
// order): H[pos a][pos b] = G[a][b] · inv_s[a] · inv_s[b], or for a dead a or b the identity's entry, and
// `damp` added on the diagonal.
struct GptqHessianBody {
  const double* gram_rows;
  int64_t r0, K;
  const int64_t* pos;
  const uint8_t* dead;
  const float* inv_s;  // null: 1
  double damp;
  double* h;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t a = r0 + idx / K, b = idx % K;
    const double sa = inv_s ? double(inv_s[a]) : 1.0, sb = inv_s ? double(inv_s[b]) : 1.0;
    double v = (dead[a] || dead[b]) ? (a == b ? 1.0 : 0.0) : gram_rows[idx] * sa * sb;
    if (a == b) v += damp;
    h[pos[a] * K + pos[b]] = v;
  }
};

// The upper triangle (column-major) from the lower: a[r K + c] = a[c K + r] for r > c. The two index
// sets are disjoint, so every thread reads what no other writes.
struct MirrorLowerBody {
  double* a;
  int64_t K;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t r = idx / K, c = idx % K;
    if (r > c) a[r * K + c] = a[c * K + r];
  }
};

// UpperFloatBody over a's own memory, for p in [first, first + count): the float at byte 4p takes the
// double at byte 8p (or 0 below the diagonal). Safe in parallel within one range of
// backend_gptq.cu's upper_in_place (it reads [8c, 16c), writes [4c, 8c)).
struct UpperFloatInPlaceBody {
  double* a;
  int64_t K, first;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t p = first + i;
    const float v = (p % K) >= (p / K) ? float(a[p]) : 0.0f;
    reinterpret_cast<float*>(a)[p] = v;
  }
};

// ---- The sweep

// The per-channel arrays of a factor on the device.
struct GptqChannels {
  const int64_t* perm;   // [K] the channel at each sweep position
  const int64_t* pos;    // [K] the sweep position of each channel
  const float* energy;   // [K] channel order: the weights of a block's error
  const uint8_t* dead;   // [K] channels whose weight is zeroed
  const int32_t* fix;    // [K] the block first reached at each sweep position, -1 none
};

// One column panel's working arrays, `width` columns, column n local to the panel.
struct GptqPanel {
  WeightView src;  // the weight's values (read at (k, n))
  WeightView dst;  // the panel's own layout: where codes and parameters go (data unused)
  float* wc;       // [K, width] the working weight, rows in sweep order
  float* err;      // [B, width] the batch's errors divided by U's diagonal
  double* sq;      // [B, width] the batch's squared weight errors
  float* vals;     // [block, width] a block's values when fixed mid-batch; null when no block is
  int64_t width;
};

// Value t of one column of a block: base[(rows ? rows[t] : t) * stride].
struct GptqColumn {
  const float* base;
  const int64_t* rows;
  int64_t stride;
  NIBBLE_HD float operator[](int64_t t) const { return base[(rows ? rows[t] : t) * stride]; }
};

// gptq_block_params: among the candidates, the smallest Σ weight[t] (v[t] - ŵ[t])² (first on ties).
NIBBLE_HD inline hd::Params gptq_block_params(const GptqColumn& v, const float* weight, int64_t n, bool partial,
                                              const BlockShape& s, const float* ratios, int64_t R, int64_t C) {
  float amax = 0, mn = partial ? 0.0f : INFINITY, mx = partial ? 0.0f : -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    const float x = v[t];
    amax = hd::max(amax, hd::fabs(x));
    mn = hd::min(mn, x);
    mx = hd::max(mx, x);
  }
  hd::Params best = s.zero_point ? hd::params_zero_point(mn, mx, s.bits, s.scale_dtype)
                         : hd::params_symmetric(amax, s.bits, s.scale_dtype);
  double best_err = INFINITY;
  for (int64_t c = 0; c < C; ++c) {
    const hd::Params p = candidate(ratios, R, c, amax, mn, mx, s);
    double err = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float x = v[t];
      const uint8_t q = hd::quantize(x, p, s.bits, s.zero_point, hd::kF32);
      const double d = double(x) - double(hd::round_to(s.scale_dtype, hd::dequantize(q, p, s.zero_point)));
      err += double(weight[t]) * d * d;
    }
    if (err < best_err) {
      best_err = err;
      best = p;
    }
  }
  return best;
}

// The working weight of a panel: wc[i][n] = W[perm i][n], zero for a dead channel.
struct GptqLoadBody {
  WeightView src;
  const int64_t* perm;
  const uint8_t* dead;
  int64_t width;
  float* wc;
  NIBBLE_HD void operator()(int64_t idx) const {
    const int64_t i = idx / width, n = idx % width, k = perm[i];
    wc[idx] = dead[k] ? 0.0f : src.at(k, n);
  }
};

// The sweep of the lazy batch [b0, b1) for column n.
struct GptqBatchBody {
  GptqPanel p;
  GptqChannels ch;
  const float* U;  // K x K row-major, upper
  int64_t K;
  BlockShape s;
  QuantOut o;  // codes, scales, zero points (block_error unused)
  const float* ratios;
  int64_t R, C;
  int64_t b0, b1;

  // fix_block: block g's parameters at sweep position i. Rows past the batch still lack the batch's
  // compensation so far, added here on the fly (into p.vals); at the batch's start there is none.
  NIBBLE_HD void fix_block(int64_t g, int64_t i, int64_t n) const {
    const int64_t W = p.width, k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K, len = k1 - k0;
    GptqColumn v{p.wc + n, ch.pos + k0, W};
    if (i > b0) {
      for (int64_t t = 0; t < len; ++t) {
        const int64_t j = ch.pos[k0 + t];
        float x = p.wc[j * W + n];
        if (j >= b1)
          for (int64_t r = b0; r < i; ++r) x -= U[r * K + j] * p.err[(r - b0) * W + n];
        p.vals[t * W + n] = x;
      }
      v = GptqColumn{p.vals + n, nullptr, W};
    }
    const hd::Params best = gptq_block_params(v, ch.energy + k0, len, len < s.block, s, ratios, R, C);
    const int64_t pi = p.dst.param((K + s.block - 1) / s.block, g, n);
    o.scales[pi] = best.scale;
    if (s.zero_point) o.zero_points[pi] = best.zero_point;
  }

  NIBBLE_HD void operator()(int64_t n) const {
    const int64_t W = p.width, G = (K + s.block - 1) / s.block;
    for (int64_t i = b0; i < b1; ++i) {
      const int64_t k = ch.perm[i], g = k / s.block;
      if (ch.fix[i] >= 0) fix_block(g, i, n);
      const int64_t pi = p.dst.param(G, g, n);
      const hd::Params prm{o.scales[pi], s.zero_point ? o.zero_points[pi] : uint8_t(0)};
      const float d = U[i * K + i], x = p.wc[i * W + n];
      const uint8_t q = hd::quantize(x, prm, s.bits, s.zero_point, hd::kF32);
      const float deq = hd::round_to(s.scale_dtype, hd::dequantize(q, prm, s.zero_point));
      o.codes[p.dst.index(k, n)] = q;
      const double e = double(p.src.at(k, n)) - double(deq);
      p.sq[(i - b0) * W + n] = e * e;
      const float scaled = (x - deq) / d;
      p.err[(i - b0) * W + n] = scaled;
      for (int64_t j = i + 1; j < b1; ++j) p.wc[j * W + n] -= U[i * K + j] * scaled;
    }
  }
};

// Per 128-column chunk c of a panel, its running squared error acc[c] plus the batch's `rows` rows of
// sq, in the CPU's order: row by row, each row's columns in order.
struct GptqChunkErrorBody {
  const double* sq;
  int64_t rows, width, chunk;
  double* acc;
  NIBBLE_HD void operator()(int64_t c) const {
    const int64_t c0 = c * chunk, c1 = c0 + chunk < width ? c0 + chunk : width;
    double t = acc[c];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = c0; n < c1; ++n) t += sq[r * width + n];
    acc[c] = t;
  }
};

}  // namespace nibble::kernels::gpu

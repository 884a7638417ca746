// Plain RTN (RtnBody's codes, scales and zero points, bit for bit) shaped for the [N, K] layout
// (k_axis 1, Gemm transB): there a quantization block's values are adjacent, so one thread per
// (block, column) walks `block` adjacent values alone while the 32 threads of its warp are `block`
// values apart. Here a warp takes one (block, column), its lanes adjacent values (lane j: k0 + j,
// k0 + j + 32, ...): each load of the warp is 32 adjacent values. Four warps (128 threads) to a CUDA
// block, adjacent warps adjacent quantization blocks; for N = K = 4096, block 128: 32768 CUDA blocks.
// The [K, N] layout keeps RtnBody's one thread per (block, column): there adjacent threads read
// adjacent columns of a row, which is coalesced already.
//
// The range (amax, or min and max) by warp_tree_reduce is exact whatever the order, so the codes are
// RtnBody's; the block's squared error is its lanes' partial sums (k ascending; in float for fp16 weights)
// added in double by the tree, not the serial sum of RtnBody and the reference: it feeds only the reported
// error, within the bound backend_check.h states for plain RTN.
#pragma once
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_blocks.h"
#include "kernels/cuda/rtn_kernels.h"

namespace nibble::kernels::gpu {

// The serial amax's rule, for the tree: a NaN wins (the block's scale is then NaN, as the serial loop's).
struct AmaxOp {
  NIBBLE_HD float operator()(float a, float b) const { return (b > a || hd::isnan(b)) ? b : a; }
};
struct MinOp {
  NIBBLE_HD float operator()(float a, float b) const { return hd::min(a, b); }
};
struct MaxOp {
  NIBBLE_HD float operator()(float a, float b) const { return hd::max(a, b); }
};

struct RtnWarpBlocks {
  static constexpr int kWarps = 4, kLanes = kWarps * kWarp, kPhases = 4;
  struct WarpShared {
    float lo[kWarp], hi[kWarp];  // lane ranges: amax in lo, or min in lo and max in hi (BlockShape::min_max)
    double err[kWarp];
    hd::Params p;
  };
  struct Shared {
    WarpShared w[kWarps];
  };
  WeightView w;  // k_axis 1
  BlockShape s;
  QuantOut o;
  int64_t items;  // G * N, item n * G + g

  template <int P>
  NIBBLE_HD void phase(int64_t block, int lane, Shared& sh) const {
    const int64_t item = block * kWarps + lane / kWarp;
    if (item >= items) return;  // the whole warp: its shuffles stay whole
    const int j = lane % kWarp;
    WarpShared& ws = sh.w[lane / kWarp];
    const int64_t K = w.K(), G = (K + s.block - 1) / s.block, n = item / G, g = item % G;
    const int64_t k0 = g * s.block, k1 = k0 + s.block < K ? k0 + s.block : K;
    if constexpr (P == 0) {
      float lo = s.min_max() ? INFINITY : 0.0f, hi = -INFINITY;
      for (int64_t k = k0 + j; k < k1; k += kWarp) {
        const float v = w.at(k, n);
        if (s.min_max()) {
          lo = hd::min(lo, v), hi = hd::max(hi, v);
        } else {
          lo = AmaxOp{}(lo, hd::fabs(v));
        }
      }
      ws.lo[j] = lo, ws.hi[j] = hi;
    } else if constexpr (P == 1) {
      // Every lane of the warp takes part in the reductions (shuffles); lane 0 has their results.
      float lo, hi = 0.0f;
      if (s.min_max()) {
        lo = warp_tree_reduce(ws.lo, j, MinOp{}), hi = warp_tree_reduce(ws.hi, j, MaxOp{});
      } else {
        lo = warp_tree_reduce(ws.lo, j, AmaxOp{});
      }
      if (j != 0) return;
      if (!s.min_max()) {
        ws.p = hd::params_symmetric(lo, s.bits, w.dtype);
      } else if (k1 - k0 < s.block) {  // ModelOpt zero-pads the last block
        ws.p = min_max_params(s, hd::min(0.0f, lo), hd::max(0.0f, hi), w.dtype);
      } else {
        ws.p = min_max_params(s, lo, hi, w.dtype);
      }
    } else if constexpr (P == 2) {
      const hd::Params p = ws.p;
      const float reciprocal = hd::reciprocal_ort(p.scale);
      float err = 0;         // fp16 weights (rtn_quantize_ref)
      double err_wide = 0;   // the wider types
      for (int64_t k = k0 + j; k < k1; k += kWarp) {
        const int64_t i = w.index(k, n);
        const float v = hd::load(w.dtype, w.data, i);
        const uint8_t c = code_of(s, v, p, reciprocal, w.dtype);
        o.codes[i] = c;
        const float dq = hd::round_to(w.dtype, hd::dequantize(c, p, s.zero_point));
        if (w.dtype == hd::kF16) {
          const float d = v - dq;
          err += d * d;
        } else {
          const double d = double(v) - double(dq);
          err_wide += d * d;
        }
      }
      ws.err[j] = w.dtype == hd::kF16 ? double(err) : err_wide;
    } else {
      const double err = warp_tree_reduce(ws.err, j, PlusOp{});
      if (j == 0) store_params(w, s, o, G, g, n, ws.p, err);
    }
  }
};

// Plain RTN of a panel on the device, in the shape its layout wants.
inline void launch_rtn(DeviceLayer& dev, const WeightView& v, const BlockShape& s, const QuantOut& o) {
  const int64_t items = ((v.K() + s.block - 1) / s.block) * v.N();
  if (v.k_axis == 1)
    launch_blocks(dev, (items + RtnWarpBlocks::kWarps - 1) / RtnWarpBlocks::kWarps, RtnWarpBlocks{v, s, o, items});
  else
    launch(dev, items, RtnBody{v, s, o});
}

}  // namespace nibble::kernels::gpu

// Kernel bodies of the layer engine's forward operations (backend_forward.cu): one thread per element, row
// or head, each calling the scalar arithmetic the reference calls (kernels/forward_math.h), so the emulated
// device gives the reference's bits and a GPU the same bits but for tanh, erf and pow.
#pragma once
#include <cstdint>

#include "kernels/cuda/hd_float.h"
#include "kernels/forward_math.h"

namespace nibble::kernels::gpu {

struct WidenBody {
  const void* src;
  int type;
  float* dst;
  NIBBLE_HD void operator()(int64_t i) const { dst[i] = hd::load(type, src, i); }
};

struct RoundBody {
  const float* x;
  int type;
  float* y;
  NIBBLE_HD void operator()(int64_t i) const { y[i] = hd::round_to(type, x[i]); }
};

// Row rows[i / K] of x into row i / K of y.
struct SelectRowsBody {
  const float* x;
  const int64_t* rows;
  int64_t K;
  float* y;
  NIBBLE_HD void operator()(int64_t i) const { y[i] = x[rows[i / K] * K + i % K]; }
};

struct StridedBody {
  Strided g;
  const float* x;
  float* y;
  NIBBLE_HD void operator()(int64_t i) const { y[i] = x[fw::strided_offset(g, i)]; }
};

// One row per thread.
struct ReduceRowsBody {
  const float* x;
  int64_t width;
  bool mean;
  float* y;
  NIBBLE_HD void operator()(int64_t r) const { y[r] = fw::reduce_row(x + r * width, width, mean); }
};

// One row per thread, in place in y (a copy of x).
struct SoftmaxRowsBody {
  float* y;
  int64_t width;
  NIBBLE_HD void operator()(int64_t r) const { fw::softmax_plain_row(y + r * width, width); }
};

struct BinaryBody {
  Broadcast g;
  ForwardBinary op;
  const float* a;
  const float* b;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const {
    int64_t ia = 0, ib = 0;
    fw::broadcast_offsets(g, i, ia, ib);
    out[i] = fw::binary(op, a[ia], b[ib]);
  }
};

struct UnaryBody {
  ForwardUnary op;
  const float* x;
  float* y;
  NIBBLE_HD void operator()(int64_t i) const { y[i] = fw::unary(op, x[i]); }
};

// One row per thread (the sums in element order, as the reference's).
struct NormBody {
  const float *x, *skip, *bias, *gamma, *beta;
  int64_t width;
  float eps;
  bool rms;
  int round;
  float *y, *sum;
  bool l2;
  NIBBLE_HD void operator()(int64_t r) const {
    fw::norm_row(x + r * width, skip ? skip + r * width : nullptr, bias, gamma, beta, width, eps, rms, round,
                 y + r * width, sum ? sum + r * width : nullptr, l2);
  }
};

// One head of one token per thread: index (b · S + s) · (Hq + 2 · Hkv) + h.
struct GatherHeadBody {
  AttentionShape g;
  const float *query, *key, *value, *cos, *sin;
  float *q, *k, *v;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t H = g.Hq + 2 * g.Hkv, h = i % H, bs = i / H;
    fw::gather_head(g, query, key, value, cos, sin, bs / g.S, bs % g.S, h, q, k, v);
  }
};

// One score row per thread: the rows of batch b's kv head kv are [(b · Hkv + kv) · group · S, + group · S),
// row r of them query position r % S.
struct SoftmaxBody {
  AttentionShape g;
  const int64_t* keys;
  float* p;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t rows_per_batch = g.Hq * g.S;
    fw::softmax_row(p + i * g.S, g.S, i % g.S, keys[i / rows_per_batch], g.scale, g.softcap, g.window);
  }
};

// The context ([B · Hkv, group · S, D]) into the output [B, S, Hq · D], rounded: one element per thread.
struct ScatterContextBody {
  AttentionShape g;
  const float* ctx;
  float* out;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t D = g.D, d = i % D, head = (i / D) % g.Hq, bs = i / (D * g.Hq), b = bs / g.S, s = bs % g.S;
    const int64_t group = g.Hq / g.Hkv, kv = head / group, hl = head % group;
    out[i] = hd::round_to(g.round, ctx[(((b * g.Hkv + kv) * group + hl) * g.S + s) * D + d]);
  }
};

}  // namespace nibble::kernels::gpu

// GroupQueryAttention's vector-Jacobian product (forward/backward.h), for the prompt form the engine runs
// (ops_attention.cc): per (batch, kv head), the group's rotated queries, keys and values and its softmax
// probabilities computed again as the forward computes them (kernels/forward_math.h), then
//   dV = Pᵀ dC,  dP = dC Vᵀ,  dZ = P ⊙ (dP − rowsum(P ⊙ dP)),  dU = dZ · (1 − (Z/cap)²) with softcap,
//   dQ = scale · dU K,  dK = scale · dUᵀ Q,
// and the rotation turned back (the transpose of a rotation: the same with −sin).
#include <cblas.h>

#include "forward/backward.h"
#include "forward/device_ops.h"
#include "kernels/forward_math.h"
#include "kernels/parallel.h"

namespace nibble::forward {
namespace {

// C[M, N] = op(A) · op(B), row-major, single-threaded sgemm (the callers run side by side).
void gemm(bool ta, bool tb, const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              1.0f, A, ta ? int(M) : int(K), B, tb ? int(K) : int(N), 0.0f, C, int(N));
}

struct AttentionGradient {
  const kernels::AttentionShape& g;
  const std::vector<int64_t>& keys;
  const float *query, *key, *value, *cos, *sin, *neg_sin;
  const float* d_ctx;                      // [B, S, Hq·D]
  const float *d_present_k, *d_present_v;  // [B, Hkv, S, D] or null
  float *dq, *dk, *dv;                     // per input, laid out as the inputs ([B, S, ...]); packed: dq only

  // The gradient of one head's gathered row back into its input's row (the rotation undone).
  void scatter(int64_t b, int64_t s, int64_t h, float* row) const {
    const int64_t D = g.D;
    if (g.rot_half > 0 && h < g.Hq + g.Hkv) kernels::fw::rotate(row, cos, neg_sin, g.rot_half, g.interleaved, s);
    float* dst;
    if (g.packed) {
      dst = dq + (b * g.S + s) * (g.Hq + 2 * g.Hkv) * D + h * D;
    } else if (h < g.Hq) {
      dst = dq + (b * g.S + s) * g.Hq * D + h * D;
    } else if (h < g.Hq + g.Hkv) {
      dst = dk + (b * g.S + s) * g.Hkv * D + (h - g.Hq) * D;
    } else {
      dst = dv + (b * g.S + s) * g.Hkv * D + (h - g.Hq - g.Hkv) * D;
    }
    for (int64_t d = 0; d < D; ++d) dst[d] = row[d];
  }

  // Head h of token (b, s) in its input row (query heads, then key heads, then value heads).
  const float* source(int64_t b, int64_t s, int64_t h) const {
    const int64_t D = g.D;
    if (g.packed) return query + (b * g.S + s) * (g.Hq + 2 * g.Hkv) * D + h * D;
    if (h < g.Hq) return query + (b * g.S + s) * g.Hq * D + h * D;
    if (h < g.Hq + g.Hkv) return key + (b * g.S + s) * g.Hkv * D + (h - g.Hq) * D;
    return value + (b * g.S + s) * g.Hkv * D + (h - g.Hq - g.Hkv) * D;
  }

  // The head as the forward reads it: rotated for position s (queries and keys), rounded to the type.
  void gather(int64_t b, int64_t s, int64_t h, float* row) const {
    std::copy_n(source(b, s, h), g.D, row);
    if (g.rot_half > 0 && h < g.Hq + g.Hkv) kernels::fw::rotate(row, cos, sin, g.rot_half, g.interleaved, s);
    for (int64_t d = 0; d < g.D; ++d) row[d] = kernels::hd::round_to(g.round, row[d]);
  }

  void group(int64_t b, int64_t kv) const {
    const int64_t G = g.Hq / g.Hkv, S = g.S, D = g.D;
    Floats q(size_t(G * S * D)), k(size_t(S * D)), v(size_t(S * D)), p(size_t(G * S * S)), dc(size_t(G * S * D)),
        dp(size_t(G * S * S)), dQ(size_t(G * S * D)), dK(size_t(S * D)), dV(size_t(S * D));
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t hl = 0; hl < G; ++hl) gather(b, s, kv * G + hl, q.data() + (hl * S + s) * D);
      gather(b, s, g.Hq + kv, k.data() + s * D);
      gather(b, s, g.Hq + g.Hkv + kv, v.data() + s * D);
    }
    // P: the forward's probabilities (zero outside each row's keys); Z kept for the softcap's derivative
    gemm(false, true, q.data(), k.data(), p.data(), G * S, S, D);
    Floats z = p;
    for (int64_t r = 0; r < G * S; ++r) {
      for (int64_t j = 0; j < S; ++j) {
        float u = z[size_t(r * S + j)] * g.scale;
        if (g.softcap > 0.0f) u = g.softcap * std::tanh(u / g.softcap);
        z[size_t(r * S + j)] = u;
      }
      kernels::fw::softmax_row(p.data() + r * S, S, r % S, keys[size_t(b)], g.scale, g.softcap, g.window);
    }
    for (int64_t hl = 0; hl < G; ++hl)
      for (int64_t s = 0; s < S; ++s)
        std::copy_n(d_ctx + ((b * S + s) * g.Hq + kv * G + hl) * D, D, dc.data() + (hl * S + s) * D);
    gemm(true, false, p.data(), dc.data(), dV.data(), S, D, G * S);  // dV = Pᵀ dC
    gemm(false, true, dc.data(), v.data(), dp.data(), G * S, S, D);  // dP = dC Vᵀ
    for (int64_t r = 0; r < G * S; ++r) {
      float* pr = p.data() + r * S;
      float* dr = dp.data() + r * S;
      double dot = 0.0;
      for (int64_t j = 0; j < S; ++j) dot += double(pr[j]) * dr[j];
      for (int64_t j = 0; j < S; ++j) {
        float du = pr[j] * (dr[j] - float(dot));
        if (g.softcap > 0.0f) {
          const float t = z[size_t(r * S + j)] / g.softcap;
          du *= 1.0f - t * t;
        }
        dr[j] = du * g.scale;
      }
    }
    gemm(false, false, dp.data(), k.data(), dQ.data(), G * S, D, S);  // dQ = dU K
    gemm(true, false, dp.data(), q.data(), dK.data(), S, D, G * S);   // dK = dUᵀ Q
    if (d_present_k || d_present_v)
      for (int64_t i = 0; i < S * D; ++i) {
        if (d_present_k) dK[size_t(i)] += d_present_k[(b * g.Hkv + kv) * S * D + i];
        if (d_present_v) dV[size_t(i)] += d_present_v[(b * g.Hkv + kv) * S * D + i];
      }
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t hl = 0; hl < G; ++hl) scatter(b, s, kv * G + hl, dQ.data() + (hl * S + s) * D);
      scatter(b, s, g.Hq + kv, dK.data() + s * D);
      scatter(b, s, g.Hq + g.Hkv + kv, dV.data() + s * D);
    }
  }
};

}  // namespace

std::vector<Floats> group_query_attention_vjp(const VjpCall& c) {
  std::vector<Floats> grads(c.fwd.in.size());
  const Floats* d0 = c.d(0);
  if (!d0 && !c.d(1) && !c.d(2)) return grads;
  std::vector<int64_t> keys;
  const kernels::AttentionShape g = gqa_shape(c.fwd, keys);
  Floats kq, kk, kv, kc, ks;
  const float* query = float32_view(&c.fwd.need(0), kq);
  const float* key = g.packed ? nullptr : float32_view(&c.fwd.need(1), kk);
  const float* value = g.packed ? nullptr : float32_view(&c.fwd.need(2), kv);
  const float* cos = g.rot_half ? float32_view(&c.fwd.need(7), kc) : nullptr;
  const float* sin = g.rot_half ? float32_view(&c.fwd.need(8), ks) : nullptr;
  Floats neg_sin(size_t(g.rot_half ? g.S * g.rot_half : 0));
  for (size_t i = 0; i < neg_sin.size(); ++i) neg_sin[i] = -sin[i];
  Floats zero_ctx(d0 ? 0 : size_t(g.B * g.S * g.Hq * g.D), 0.0f);
  grads[0].assign(size_t(c.fwd.need(0).numel()), 0.0f);
  if (!g.packed) {
    grads[1].assign(size_t(c.fwd.need(1).numel()), 0.0f);
    grads[2].assign(size_t(c.fwd.need(2).numel()), 0.0f);
  }
  const AttentionGradient a{g, keys, query, key, value, cos, sin, neg_sin.data(), d0 ? d0->data() : zero_ctx.data(),
                            c.d(1) ? c.d(1)->data() : nullptr, c.d(2) ? c.d(2)->data() : nullptr,
                            grads[0].data(), g.packed ? nullptr : grads[1].data(), g.packed ? nullptr : grads[2].data()};
  kernels::parallel_for(g.B * g.Hkv, [&](int64_t i) { a.group(i / g.Hkv, i % g.Hkv); });
  for (size_t k = 0; k < grads.size(); ++k)
    if (!c.want(k)) grads[k].clear();
  return grads;
}

}  // namespace nibble::forward

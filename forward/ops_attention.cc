// GroupQueryAttention (com.microsoft), as ONNX Runtime GenAI's model builder emits it for a prompt with an
// empty past: query [B, S, Hq·D] (or q, k, v packed in it), rotary embedding inside (do_rotary, the cos/sin
// caches, positions 0..S-1), causal softmax over the first seqlens_k[b] + 1 keys, an optional local window
// (the last local_window_size keys, the query's own included: what ONNX Runtime 1.24's CPU kernel computes,
// measured against it) and softcap; outputs the context [B, S, Hq·D] and present key/value [B, Hkv, S, D].
//
// Per ONNX Runtime's CPU kernel: rotated q and k are rounded to the value's type; scores, softmax and the
// context are float32 (two sgemm products per key/value head), the context rounded once. A query row past its sequence's length (right padding)
// attends to the sequence's keys only (ONNX Runtime's CPU kernel leaves those rows undefined).
#include <chrono>
#include <cmath>

#include "forward/broadcast.h"
#include "forward/device_ops.h"
#include "forward/fast_exp.h"
#include "forward/op_table.h"
#include "forward/softmax_rows.h"
#include "forward/matmul.h"
#include "kernels/forward_math.h"
#include "kernels/forward_types.h"
#include "kernels/parallel.h"

namespace nibble::forward {

namespace {

struct Gqa {
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f, softcap = 0.0f;
  int64_t window = -1;
  bool rotary = false, interleaved = false;
  int64_t rot_half = 0;  // cos/sin cache width: rotary dimension / 2
};

// x (D floats) rotated in place for position `pos`: the device bodies' rotation (kernels/forward_math.h).
void rotate(float* x, const Gqa& g, const float* cos, const float* sin, int64_t pos) {
  kernels::fw::rotate(x, cos, sin, g.rot_half, g.interleaved, pos);
}

// q, k, v as [B, H, S, D] float32, rotated and rounded to `t`.
struct Heads {
  Floats q, k, v;
};

Heads split_heads(const OpCall& c, const Gqa& g, DType t) {
  const Value& query = c.need(0);
  const bool packed = !c.input(1);
  Floats kq, kk, kv, kcos, ksin;  // the inputs read where they lie when float32, else widened into these
  const float* qf = float32_view(&query, kq);
  const float* kf = packed ? nullptr : float32_view(&c.need(1), kk);
  const float* vf = packed ? nullptr : float32_view(&c.need(2), kv);
  const float* cos = nullptr;
  const float* sin = nullptr;
  if (g.rotary) {
    cos = float32_view(&c.need(7), kcos);
    sin = float32_view(&c.need(8), ksin);
    if (c.need(7).numel() < g.S * g.rot_half || c.need(8).numel() < g.S * g.rot_half)
      c.fail("the cos/sin caches hold fewer than " + std::to_string(g.S) + " positions");
  }
  Heads h{Floats(size_t(g.B * g.Hq * g.S * g.D)), Floats(size_t(g.B * g.Hkv * g.S * g.D)),
          Floats(size_t(g.B * g.Hkv * g.S * g.D))};
  const int64_t width = packed ? (g.Hq + 2 * g.Hkv) * g.D : 0;
  kernels::parallel_for(g.B * g.S, [&](int64_t bs) {
    const int64_t b = bs / g.S, s = bs % g.S;
    {
      auto src = [&](const float* x, int64_t row_width, int64_t col) { return x + (b * g.S + s) * row_width + col; };
      for (int64_t hd = 0; hd < g.Hq; ++hd) {
        float* dq = h.q.data() + ((b * g.Hq + hd) * g.S + s) * g.D;
        std::copy_n(packed ? src(qf, width, hd * g.D) : src(qf, g.Hq * g.D, hd * g.D), g.D, dq);
        if (g.rotary) rotate(dq, g, cos, sin, s);
      }
      for (int64_t hd = 0; hd < g.Hkv; ++hd) {
        float* dk = h.k.data() + ((b * g.Hkv + hd) * g.S + s) * g.D;
        float* dv = h.v.data() + ((b * g.Hkv + hd) * g.S + s) * g.D;
        std::copy_n(packed ? src(qf, width, (g.Hq + hd) * g.D) : src(kf, g.Hkv * g.D, hd * g.D), g.D, dk);
        std::copy_n(packed ? src(qf, width, (g.Hq + g.Hkv + hd) * g.D) : src(vf, g.Hkv * g.D, hd * g.D), g.D, dv);
        if (g.rotary) rotate(dk, g, cos, sin, s);
      }
    }
  });
  if (t != DType::kFloat32)
    for (auto* x : {&h.q, &h.k, &h.v})
      parallel_ranges(int64_t(x->size()), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) (*x)[size_t(i)] = round_to(t, (*x)[size_t(i)]);
      });
  return h;
}

// Row `s` of one head's scores, in place: scaled (and capped) over the keys it sees, softmaxed as ONNX
// Runtime's kernel does (softmax_row_mlas), zero elsewhere.
void softmax_row(const Gqa& g, float* row, int64_t s, int64_t keys) {
  const int64_t S = g.S;
  const int64_t end = std::min(s + 1, keys);
  const int64_t begin = g.window > 0 && end > g.window ? end - g.window : 0;
  for (int64_t j = begin; j < end; ++j) {
    float d = row[j] * g.scale;
    if (g.softcap > 0.0f) d = g.softcap * std::tanh(d / g.softcap);
    row[j] = d;
  }
  softmax_row_mlas(row + begin, end - begin);
  for (int64_t j = 0; j < S; ++j)
    if (j < begin || j >= end) row[j] = 0.0f;
}

// One (batch, kv head) and the query heads that share it: scores for all of them in one product
// ([heads · S, D] · Kᵀ), the causal (windowed, capped) softmax per row, the context in a second product
// ([heads · S, S] · V), written into out ([B, S, Hq·D]).
// One thread's work: the products on the calling thread (the groups run side by side).
void attend_group(const Gqa& g, const Heads& h, int64_t b, int64_t kv, int64_t keys, Floats& out) {
  const int64_t group = g.Hq / g.Hkv, S = g.S, D = g.D;
  const float* q = h.q.data() + (b * g.Hq + kv * group) * S * D;  // the group's heads are adjacent
  const float* k = h.k.data() + (b * g.Hkv + kv) * S * D;
  const float* v = h.v.data() + (b * g.Hkv + kv) * S * D;
  Floats p(static_cast<size_t>(group * S * S)), ctx(static_cast<size_t>(group * S * D));
  matmul_blas(q, k, p.data(), group * S, D, S, /*b_transposed=*/true, kernels::forward_k_slice(S, D, false));
  for (int64_t r = 0; r < group * S; ++r) softmax_row(g, p.data() + r * S, r % S, keys);
  matmul_blas(p.data(), v, ctx.data(), group * S, S, D, false, kernels::forward_k_slice(D, S, false));
  for (int64_t hl = 0; hl < group; ++hl)
    for (int64_t s = 0; s < S; ++s)
      std::copy_n(ctx.data() + (hl * S + s) * D, D, out.data() + ((b * S + s) * g.Hq + kv * group + hl) * D);
}

Gqa read_gqa(const OpCall& c) {
  const Value& query = c.need(0);
  if (query.shape.size() != 3) c.fail("query must be [batch, sequence, hidden], got " + shape_text(query.shape));
  Gqa g;
  g.B = query.shape[0];
  g.S = query.shape[1];
  g.Hq = c.int_attr("num_heads", 0);
  g.Hkv = c.int_attr("kv_num_heads", 0);
  if (g.Hq <= 0 || g.Hkv <= 0 || g.Hq % g.Hkv) c.fail("num_heads and kv_num_heads must be positive, kv dividing q");
  const int64_t width = query.shape[2];
  g.D = c.input(1) ? width / g.Hq : width / (g.Hq + 2 * g.Hkv);
  g.scale = c.float_attr("scale", 0.0f);
  if (g.scale == 0.0f) g.scale = 1.0f / std::sqrt(float(g.D));
  g.softcap = c.float_attr("softcap", 0.0f);
  g.window = c.int_attr("local_window_size", -1);
  g.rotary = c.int_attr("do_rotary", 0) != 0;
  g.interleaved = c.int_attr("rotary_interleaved", 0) != 0;
  if (c.int_attr("smooth_softmax", 0)) c.fail("smooth_softmax is not supported");
  for (size_t i = 9; i < c.in.size(); ++i)
    if (c.in[i]) c.fail("input " + std::to_string(i) + " (position ids, attention bias, head sink) is not supported");
  for (size_t i : {size_t(3), size_t(4)})
    if (c.input(i) && c.input(i)->numel() != 0) c.fail("a non-empty past key/value (only a prompt is supported)");
  if (g.rotary) {
    const Value& cos = c.need(7);
    if (cos.shape.size() != 2 || 2 * cos.shape[1] > g.D) c.fail("cos_cache of " + shape_text(cos.shape) + " for head size " + std::to_string(g.D));
    g.rot_half = cos.shape[1];
  }
  return g;
}

std::vector<Value> group_query_attention(const OpCall& c) {
  const Gqa g = read_gqa(c);
  const DType t = c.need(0).dtype;
  const auto seqlens = to_ints(c.need(5));
  const auto total = to_ints(c.need(6));
  if (int64_t(seqlens.size()) != g.B) c.fail("seqlens_k has " + std::to_string(seqlens.size()) + " values for batch " + std::to_string(g.B));
  if (total.size() != 1 || total[0] != g.S) c.fail("total_sequence_length must equal the sequence length (a prompt)");
  Heads h = split_heads(c, g, t);
  Floats out(static_cast<size_t>(g.B * g.S * g.Hq * g.D));
  const auto t0 = std::chrono::steady_clock::now();
  kernels::parallel_for(g.B * g.Hkv, [&](int64_t i) {
    const int64_t b = i / g.Hkv;
    attend_group(g, h, b, i % g.Hkv, std::min(g.S, seqlens[size_t(b)] + 1), out);
  });
  if (c.meter) {  // the two products of every group; the seconds are the groups' wall time, softmax included
    c.meter->flop += 4.0 * double(g.B * g.Hq) * double(g.S) * double(g.S) * double(g.D);
    c.meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return {from_floats(t, {g.B, g.S, g.Hq * g.D}, std::move(out)), from_floats(t, {g.B, g.Hkv, g.S, g.D}, std::move(h.k)),
          from_floats(t, {g.B, g.Hkv, g.S, g.D}, std::move(h.v))};
}

}  // namespace

kernels::AttentionShape gqa_shape(const OpCall& c, std::vector<int64_t>& keys) {
  const Gqa g = read_gqa(c);
  const auto seqlens = to_ints(c.need(5));
  const auto total = to_ints(c.need(6));
  if (int64_t(seqlens.size()) != g.B) c.fail("seqlens_k has " + std::to_string(seqlens.size()) + " values for batch " + std::to_string(g.B));
  if (total.size() != 1 || total[0] != g.S) c.fail("total_sequence_length must equal the sequence length (a prompt)");
  keys.clear();
  for (int64_t n : seqlens) keys.push_back(std::min(g.S, n + 1));
  kernels::AttentionShape a;
  a.B = g.B;
  a.S = g.S;
  a.Hq = g.Hq;
  a.Hkv = g.Hkv;
  a.D = g.D;
  a.rot_half = g.rotary ? g.rot_half : 0;
  a.window = g.window;
  a.scale = g.scale;
  a.softcap = g.softcap;
  a.interleaved = g.interleaved;
  a.packed = !c.input(1);
  a.round = int(c.need(0).dtype);
  return a;
}

// RotaryEmbedding (com.microsoft): input [B, S, N·D] (num_heads given) or [B, N, S, D]; position ids [B, S],
// or one offset for positions offset + s; the first rotary_embedding_dim (default: the caches' width · 2)
// elements of each head rotated as GroupQueryAttention's rotary does, the rest copied.
std::vector<Value> rotary_embedding(const OpCall& c) {
  const Value& x = c.need(0);
  const auto pos = to_ints(c.need(1));
  Floats kcos, ksin;
  const float* cos = float32_view(&c.need(2), kcos);
  const float* sin = float32_view(&c.need(3), ksin);
  const Value& cache = c.need(2);
  if (c.need(3).numel() != cache.numel()) c.fail("cos_cache and sin_cache differ in size");
  if (cache.shape.size() != 2) c.fail("cos_cache must be 2-D, got " + shape_text(cache.shape));
  if (c.int_attr("is_packed_batching", 0)) c.fail("is_packed_batching is not supported");
  const bool bnsd = x.shape.size() == 4;
  if (!bnsd && x.shape.size() != 3) c.fail("input must be [batch, seq, hidden] or [batch, heads, seq, head], got " + shape_text(x.shape));
  const int64_t B = x.shape[0], S = bnsd ? x.shape[2] : x.shape[1];
  Gqa g;
  g.rot_half = cache.shape[1];
  g.interleaved = c.int_attr("interleaved", 0) != 0;
  const int64_t rot = c.int_attr("rotary_embedding_dim", 0);
  if (rot > 0) g.rot_half = rot / 2;
  int64_t N = bnsd ? x.shape[1] : c.int_attr("num_heads", 0);
  if (!bnsd && N <= 0) N = x.shape[2] / (2 * g.rot_half);
  g.D = bnsd ? x.shape[3] : x.shape[2] / N;
  if (N <= 0 || 2 * g.rot_half > g.D) c.fail("rotary dimension " + std::to_string(2 * g.rot_half) + " for head size " + std::to_string(g.D));
  if (pos.size() != 1 && int64_t(pos.size()) != B * S) c.fail("position_ids of " + std::to_string(pos.size()) + " values for " + shape_text(x.shape));
  Floats v = to_floats(x);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t p = pos.size() == 1 ? pos[0] + s : pos[size_t(b * S + s)];
        if (p < 0 || (p + 1) * g.rot_half > cache.numel()) c.fail("position " + std::to_string(p) + " is past the caches");
        float* head = v.data() + (bnsd ? ((b * N + n) * S + s) * g.D : ((b * S + s) * N + n) * g.D);
        rotate(head, g, cos, sin, p);
      }
  return {from_floats(x.dtype, x.shape, std::move(v))};
}

void add_attention_ops(OpTable& t) {
  t["com.microsoft:RotaryEmbedding"] = {rotary_embedding, false};
  t["com.microsoft:GroupQueryAttention"] = {group_query_attention, false};
}

}  // namespace nibble::forward

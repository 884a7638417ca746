// MultiHeadAttention (com.microsoft), as ONNX Runtime GenAI's model builder emits it where its
// GroupQueryAttention does not run (CUDA with float32, the CPU with fp16): query, key and value
// [B, S, N·D] already rotated (RotaryEmbedding before it), an additive attention_bias [B or 1, N or 1, S, T]
// (the builder's 4D mask: 0 where a key is seen, the type's lowest value elsewhere) and an empty past;
// outputs the context [B, S, N·D] and present key/value [B, N, S, D].
//
// As ONNX Runtime's CPU kernel: per (batch, head) the scores Q·Kᵀ in one sgemm (K in MLAS's slices for two
// activations), scaled, the bias added, softmaxed as its Softmax (softmax_row_mlas), the context a second
// sgemm, rounded once to the value's type.
#include <chrono>
#include <cmath>

#include "forward/broadcast.h"
#include "forward/matmul.h"
#include "forward/op_table.h"
#include "forward/softmax_rows.h"
#include "kernels/forward_types.h"
#include "kernels/parallel.h"

namespace nibble::forward {

namespace {

struct Mha {
  int64_t B = 0, S = 0, L = 0, N = 0, D = 0, Dv = 0;
  float scale = 0.0f;
};

Mha read_mha(const OpCall& c) {
  const Value& q = c.need(0);
  const Value& k = c.need(1);
  const Value& v = c.need(2);
  if (q.shape.size() != 3 || k.shape.size() != 3 || v.shape.size() != 3)
    c.fail("query, key and value must be [batch, sequence, hidden] (packed or BNSH forms are not supported)");
  Mha m;
  m.B = q.shape[0];
  m.S = q.shape[1];
  m.L = k.shape[1];
  m.N = c.int_attr("num_heads", 0);
  if (m.N <= 0 || q.shape[2] % m.N || v.shape[2] % m.N) c.fail("num_heads must divide the hidden sizes");
  m.D = q.shape[2] / m.N;
  m.Dv = v.shape[2] / m.N;
  if (k.shape[0] != m.B || v.shape[0] != m.B || k.shape[2] != q.shape[2] || v.shape[1] != m.L)
    c.fail("query " + shape_text(q.shape) + ", key " + shape_text(k.shape) + " and value " + shape_text(v.shape) + " do not match");
  m.scale = c.float_attr("scale", 0.0f);
  if (m.scale == 0.0f) m.scale = 1.0f / std::sqrt(float(m.D));
  if (c.int_attr("unidirectional", 0)) c.fail("unidirectional is not supported (the builder masks through attention_bias)");
  if (c.input(3) && c.input(3)->numel()) c.fail("a bias input is not supported");
  if (c.input(4) && c.input(4)->numel()) c.fail("key_padding_mask is not supported (the builder masks through attention_bias)");
  for (size_t i : {size_t(6), size_t(7)})
    if (c.input(i) && c.input(i)->numel() != 0) c.fail("a non-empty past key/value (only a prompt is supported)");
  for (size_t i = 8; i < c.in.size(); ++i)
    if (c.in[i]) c.fail("input " + std::to_string(i) + " is not supported");
  return m;
}

// x [B, rows, N·width] as [B, N, rows, width].
Floats to_heads(const float* x, int64_t B, int64_t rows, int64_t N, int64_t width) {
  Floats out(size_t(B * N * rows * width));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < N; ++n)
        std::copy_n(x + ((b * rows + r) * N + n) * width, width, out.data() + ((b * N + n) * rows + r) * width);
  return out;
}

std::vector<Value> multi_head_attention(const OpCall& c) {
  const Mha m = read_mha(c);
  const DType t = c.need(0).dtype;
  Floats kq, kk, kv, kb;
  const Floats q = to_heads(float32_view(&c.need(0), kq), m.B, m.S, m.N, m.D);
  Floats k = to_heads(float32_view(&c.need(1), kk), m.B, m.L, m.N, m.D);
  Floats v = to_heads(float32_view(&c.need(2), kv), m.B, m.L, m.N, m.Dv);
  const Value* bias = c.input(5);
  const float* bf = bias && bias->numel() ? float32_view(bias, kb) : nullptr;
  std::vector<int64_t> bias_strides;
  if (bf) {
    const std::vector<int64_t> full = {m.B, m.N, m.S, m.L};
    if (bias->shape.size() != 4 || broadcast_shape(c, {bias->shape, full}) != full)
      c.fail("attention_bias " + shape_text(bias->shape) + " does not broadcast to " + shape_text(full));
    bias_strides = broadcast_strides(bias->shape, full);
  }
  Floats out(size_t(m.B * m.S * m.N * m.Dv));
  const auto t0 = std::chrono::steady_clock::now();
  kernels::parallel_for(m.B * m.N, [&](int64_t i) {
    const int64_t b = i / m.N, n = i % m.N;
    Floats p(size_t(m.S * m.L)), ctx(size_t(m.S * m.Dv));
    matmul_blas(q.data() + i * m.S * m.D, k.data() + i * m.L * m.D, p.data(), m.S, m.D, m.L, /*b_transposed=*/true,
                kernels::forward_k_slice(m.L, m.D, false));
    for (int64_t s = 0; s < m.S; ++s) {
      float* row = p.data() + s * m.L;
      for (int64_t j = 0; j < m.L; ++j) {
        row[j] *= m.scale;
        if (bf) row[j] += bf[b * bias_strides[0] + n * bias_strides[1] + s * bias_strides[2] + j * bias_strides[3]];
      }
      softmax_row_mlas(row, m.L);
    }
    matmul_blas(p.data(), v.data() + i * m.L * m.Dv, ctx.data(), m.S, m.L, m.Dv, false, kernels::forward_k_slice(m.Dv, m.L, false));
    for (int64_t s = 0; s < m.S; ++s) std::copy_n(ctx.data() + s * m.Dv, m.Dv, out.data() + ((b * m.S + s) * m.N + n) * m.Dv);
  });
  if (c.meter) {
    c.meter->flop += 2.0 * double(m.B * m.N) * double(m.S) * double(m.L) * double(m.D + m.Dv);
    c.meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return {from_floats(t, {m.B, m.S, m.N * m.Dv}, std::move(out)), from_floats(t, {m.B, m.N, m.L, m.D}, std::move(k)),
          from_floats(t, {m.B, m.N, m.L, m.Dv}, std::move(v))};
}

}  // namespace

void add_mha_ops(OpTable& t) { t["com.microsoft:MultiHeadAttention"] = {multi_head_attention, false}; }

}  // namespace nibble::forward

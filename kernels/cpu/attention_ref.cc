// forward_attention's definition (forward_ref.h): the heads gathered, rotated and rounded, then per
// (batch, kv head) the scores of its query heads as float32 dot products in d order, the softmax per row,
// the context as float32 sums in key order, rounded once.
#include <stdexcept>
#include <string>

#include "kernels/cpu/forward_ref.h"
#include "kernels/forward_math.h"

namespace nibble::kernels {

std::vector<Tensor> forward_attention_ref(const AttentionArgs& a) {
  check_attention(a);
  const AttentionShape& g = a.g;
  const int64_t S = g.S, D = g.D, group = g.Hq / g.Hkv;
  const std::vector<float> query = forward_floats(a.query);
  const std::vector<float> key = g.packed ? std::vector<float>{} : forward_floats(a.key);
  const std::vector<float> value = g.packed ? std::vector<float>{} : forward_floats(a.value);
  const std::vector<float> cos = g.rot_half ? forward_floats(a.cos) : std::vector<float>{};
  const std::vector<float> sin = g.rot_half ? forward_floats(a.sin) : std::vector<float>{};
  std::vector<float> q(size_t(g.B * g.Hq * S * D)), k(size_t(g.B * g.Hkv * S * D)), v(k.size());
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < g.Hq + 2 * g.Hkv; ++h)
        fw::gather_head(g, query.data(), key.data(), value.data(), cos.data(), sin.data(), b, s, h, q.data(), k.data(),
                        v.data());
  std::vector<float> out(q.size()), p(static_cast<size_t>(S));
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t kv = 0; kv < g.Hkv; ++kv)
      for (int64_t r = 0; r < group * S; ++r) {
        const int64_t hl = r / S, s = r % S, head = kv * group + hl;
        const float* qr = q.data() + ((b * g.Hq + head) * S + s) * D;
        const float* kh = k.data() + (b * g.Hkv + kv) * S * D;
        const float* vh = v.data() + (b * g.Hkv + kv) * S * D;
        for (int64_t j = 0; j < S; ++j) {
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qr[d] * kh[j * D + d];
          p[size_t(j)] = dot;
        }
        fw::softmax_row(p.data(), S, s, a.keys[size_t(b)], g.scale, g.softcap, g.window);
        for (int64_t d = 0; d < D; ++d) {
          float c = 0.0f;
          for (int64_t j = 0; j < S; ++j) c += p[size_t(j)] * vh[j * D + d];
          out[size_t(((b * S + s) * g.Hq + head) * D + d)] = hd::round_to(g.round, c);
        }
      }
  std::vector<Tensor> r;
  r.push_back(host_tensor(DType::kFloat32, {g.B, S, g.Hq * D}, std::move(out)));
  r.push_back(host_tensor(DType::kFloat32, {g.B, g.Hkv, S, D}, std::move(k)));
  r.push_back(host_tensor(DType::kFloat32, {g.B, g.Hkv, S, D}, std::move(v)));
  return r;
}

}  // namespace nibble::kernels

#include "kernels/cpu/forward_ref.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/forward_math.h"

namespace nibble::kernels {
namespace {

void need_host(const Tensor& t, const char* op) {
  if (!t.data && t.elements() > 0) throw std::invalid_argument(std::string(op) + ": a tensor without host data");
}

int round_type(DType t) { return int(t); }

}  // namespace

std::vector<float> forward_floats(const Tensor& x) {
  need_host(x, "forward");
  std::vector<float> v(size_t(x.elements()));
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kFloat16 && x.dtype != DType::kBFloat16)
    throw std::invalid_argument("forward: a float32, fp16 or bf16 tensor, got " + dtype_name(x.dtype));
  for (size_t i = 0; i < v.size(); ++i) v[i] = hd::load(int(x.dtype), x.data, int64_t(i));
  return v;
}

Tensor forward_widen_ref(const Tensor& t) { return host_tensor(DType::kFloat32, t.shape, forward_floats(t)); }

Tensor forward_round_ref(const Tensor& x, DType to) {
  std::vector<float> v = forward_floats(x);
  for (float& f : v) f = hd::round_to(round_type(to), f);
  return host_tensor(DType::kFloat32, x.shape, std::move(v));
}

Tensor forward_strided_ref(const Tensor& x, const Strided& g) {
  const std::vector<float> v = forward_floats(x);
  std::vector<float> out(size_t(g.elements()));
  for (int64_t i = 0; i < int64_t(out.size()); ++i) {
    const int64_t o = fw::strided_offset(g, i);
    if (o < 0 || o >= int64_t(v.size())) throw std::invalid_argument("forward_strided: an element outside x");
    out[size_t(i)] = v[size_t(o)];
  }
  return host_tensor(DType::kFloat32, std::vector<int64_t>(g.out, g.out + g.rank), std::move(out));
}

Tensor forward_reduce_rows_ref(const Tensor& x, int64_t width, bool mean) {
  if (width <= 0 || x.elements() % width) throw std::invalid_argument("forward_reduce_rows: rows of the width");
  const std::vector<float> v = forward_floats(x);
  std::vector<float> out(v.size() / size_t(width));
  for (size_t r = 0; r < out.size(); ++r) out[r] = fw::reduce_row(v.data() + r * size_t(width), width, mean);
  return host_tensor(DType::kFloat32, {int64_t(out.size())}, std::move(out));
}

Tensor forward_softmax_rows_ref(const Tensor& x, int64_t width) {
  if (width <= 0 || x.elements() % width) throw std::invalid_argument("forward_softmax_rows: rows of the width");
  std::vector<float> v = forward_floats(x);
  for (size_t r = 0; r < v.size() / size_t(width); ++r) fw::softmax_plain_row(v.data() + r * size_t(width), width);
  return host_tensor(DType::kFloat32, x.shape, std::move(v));
}

void forward_batched_shapes(const Tensor& a, const Tensor& b, int64_t& batch, int64_t& M, int64_t& K, int64_t& N) {
  const size_t r = a.shape.size();
  if (r < 3 || b.shape.size() != r || !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin()) ||
      a.shape[r - 1] != b.shape[r - 2])
    throw std::invalid_argument("forward_matmul_batched: [batch.., M, K] and [batch.., K, N]");
  M = a.shape[r - 2], K = a.shape[r - 1], N = b.shape[r - 1];
  batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) batch *= a.shape[i];
}

Tensor forward_matmul_batched_ref(const Tensor& a, const Tensor& b, bool blas) {
  int64_t batch = 0, M = 0, K = 0, N = 0;
  forward_batched_shapes(a, b, batch, M, K, N);
  const std::vector<float> x = forward_floats(a), y = forward_floats(b);
  std::vector<float> c(size_t(batch * M * N));
  for (int64_t i = 0; i < batch; ++i)
    (blas ? forward_matmul_blas : forward_matmul_ref)(x.data() + i * M * K, y.data() + i * K * N, c.data() + i * M * N,
                                                      M, K, N, false);
  std::vector<int64_t> shape = a.shape;
  shape.back() = N;
  return host_tensor(DType::kFloat32, std::move(shape), std::move(c));
}

Tensor forward_select_rows_ref(const Tensor& x, const std::vector<int64_t>& counted) {
  if (x.shape.size() != 2 || int64_t(counted.size()) != x.shape[0])
    throw std::invalid_argument("forward_select_rows: x [n, K] and n flags");
  const std::vector<float> v = forward_floats(x);
  const int64_t K = x.shape[1];
  std::vector<float> out;
  for (size_t r = 0; r < counted.size(); ++r)
    if (counted[r]) out.insert(out.end(), v.begin() + int64_t(r) * K, v.begin() + int64_t(r + 1) * K);
  const int64_t n = K ? int64_t(out.size()) / K : 0;
  return host_tensor(DType::kFloat32, {n, K}, std::move(out));
}

void forward_matmul_shapes(const Tensor& x, const Tensor& w, bool w_transposed, int64_t& M, int64_t& K, int64_t& N) {
  if (x.shape.empty() || w.shape.size() != 2) throw std::invalid_argument("forward_matmul: x [.., K] and a 2-D w");
  K = x.shape.back();
  N = w_transposed ? w.shape[0] : w.shape[1];
  if ((w_transposed ? w.shape[1] : w.shape[0]) != K)
    throw std::invalid_argument("forward_matmul: w of " + std::to_string(w.shape[0]) + " x " +
                                std::to_string(w.shape[1]) + " for rows of " + std::to_string(K));
  M = K ? x.elements() / K : 0;
}

void forward_matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed) {
  fw::matmul_ref(A, B, C, M, K, N, b_transposed);
}

Tensor forward_binary_ref(ForwardBinary op, const Tensor& a, const Tensor& b) {
  const Broadcast g = broadcast_of(a.shape, b.shape);
  const std::vector<float> x = forward_floats(a), y = forward_floats(b);
  std::vector<float> out(size_t(g.elements()));
  for (int64_t i = 0; i < int64_t(out.size()); ++i) {
    int64_t ia = 0, ib = 0;
    fw::broadcast_offsets(g, i, ia, ib);
    out[size_t(i)] = fw::binary(op, x[size_t(ia)], y[size_t(ib)]);
  }
  return host_tensor(DType::kFloat32, g.shape(), std::move(out));
}

Tensor forward_unary_ref(ForwardUnary op, const Tensor& x) {
  std::vector<float> v = forward_floats(x);
  for (float& f : v) f = fw::unary(op, f);
  return host_tensor(DType::kFloat32, x.shape, std::move(v));
}

std::vector<Tensor> forward_norm_ref(const NormArgs& a) {
  const int64_t W = a.width;
  if (W <= 0 || a.x.elements() % W) throw std::invalid_argument("forward_norm: rows of " + std::to_string(W));
  const std::vector<float> x = forward_floats(a.x), g = a.l2 ? std::vector<float>(size_t(W), 1.0f) : forward_floats(a.gamma);
  const std::vector<float> skip = a.skip.empty() ? std::vector<float>{} : forward_floats(a.skip);
  const std::vector<float> bias = a.bias.empty() ? std::vector<float>{} : forward_floats(a.bias);
  const std::vector<float> beta = a.beta.empty() ? std::vector<float>{} : forward_floats(a.beta);
  if (int64_t(g.size()) != W || (!skip.empty() && skip.size() != x.size()) ||
      (!bias.empty() && int64_t(bias.size()) != W) || (!beta.empty() && int64_t(beta.size()) != W))
    throw std::invalid_argument("forward_norm: gamma, beta and bias of the row's width, skip of x's shape");
  std::vector<float> y(x.size()), sum(a.with_sum ? x.size() : 0);
  for (int64_t r = 0; r < int64_t(x.size()) / W; ++r)
    fw::norm_row(x.data() + r * W, skip.empty() ? nullptr : skip.data() + r * W, bias.empty() ? nullptr : bias.data(),
                 g.data(), beta.empty() ? nullptr : beta.data(), W, a.eps, a.rms, round_type(a.round), y.data() + r * W,
                 a.with_sum ? sum.data() + r * W : nullptr, a.l2);
  std::vector<Tensor> out{host_tensor(DType::kFloat32, a.x.shape, std::move(y))};
  if (a.with_sum) out.push_back(host_tensor(DType::kFloat32, a.x.shape, std::move(sum)));
  return out;
}

}  // namespace nibble::kernels

// The operators' vector-Jacobian products (forward/backward.h), host float32. Each recomputes what it
// needs of its forward (a norm's row deviation, attention's probabilities) from the forward's inputs,
// the same expressions as the operator in float32; fp16 rounding is passed straight through.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "forward/backward.h"
#include "forward/broadcast.h"
#include "forward/matmul.h"
#include "kernels/forward_math.h"
#include "kernels/parallel.h"

namespace nibble::forward {
namespace {

std::vector<Floats> gradients_for(const VjpCall& c) { return std::vector<Floats>(c.fwd.in.size()); }

const float* floats_of(const Value* v, Floats& keep) { return float32_view(v, keep); }

// Where each element of `out` reads `in` under numpy broadcasting (in's rank at most out's).
std::vector<int64_t> broadcast_sources(const std::vector<int64_t>& out, const std::vector<int64_t>& in) {
  const size_t r = out.size(), ri = in.size();
  std::vector<int64_t> stride(r, 0);
  int64_t acc = 1;
  for (size_t k = 0; k < ri; ++k) {
    const size_t d = ri - 1 - k, o = r - 1 - k;
    stride[o] = in[d] == 1 ? 0 : acc;
    acc *= in[d];
  }
  const int64_t n = numel_of(out);
  std::vector<int64_t> src(static_cast<size_t>(n));
  std::vector<int64_t> idx(r, 0);
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    src[size_t(i)] = at;
    for (size_t k = r; k-- > 0;) {  // the next index, the source offset following it
      if (++idx[k] < out[k]) {
        at += stride[k];
        break;
      }
      at -= stride[k] * (out[k] - 1);
      idx[k] = 0;
    }
  }
  return src;
}

// d (laid out as `out`) summed into an input of shape `in` (broadcast's reverse), each element times
// factor(i) when given: in output order, so the sums do not depend on threads.
Floats reduce_to(const std::vector<int64_t>& out, const std::vector<int64_t>& in, const float* d,
                 const std::function<float(int64_t)>& factor) {
  const int64_t n = numel_of(out);
  Floats g(size_t(numel_of(in)), 0.0f);
  if (in == out) {
    parallel_ranges(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) g[size_t(i)] = factor ? d[i] * factor(i) : d[i];
    });
    return g;
  }
  const std::vector<int64_t> src = broadcast_sources(out, in);
  for (int64_t i = 0; i < n; ++i) g[size_t(src[size_t(i)])] += factor ? d[i] * factor(i) : d[i];
  return g;
}

// Add, Sub, Mul, Div: y = a ∘ b, numpy broadcasting.
std::vector<Floats> binary(const VjpCall& c, char op) {
  std::vector<Floats> g = gradients_for(c);
  const Floats* d = c.d(0);
  if (!d) return g;
  const Value& a = c.fwd.need(0);
  const Value& b = c.fwd.need(1);
  const auto& shape = c.out[0]->shape;
  Floats ka, kb;
  const float* av = floats_of(&a, ka);
  const float* bv = floats_of(&b, kb);
  std::vector<int64_t> sa, sb;  // each output element's operands
  if ((op == '*' || op == '/') && a.shape != shape) sa = broadcast_sources(shape, a.shape);
  if ((op == '*' || op == '/') && b.shape != shape) sb = broadcast_sources(shape, b.shape);
  auto A = [&](int64_t i) { return av[sa.empty() ? i : sa[size_t(i)]]; };
  auto B = [&](int64_t i) { return bv[sb.empty() ? i : sb[size_t(i)]]; };
  if (c.want(0)) {
    std::function<float(int64_t)> f;
    if (op == '*') f = B;
    if (op == '/') f = [&](int64_t i) { return 1.0f / B(i); };
    g[0] = reduce_to(shape, a.shape, d->data(), f);
  }
  if (c.want(1)) {
    std::function<float(int64_t)> f;
    if (op == '-') f = [](int64_t) { return -1.0f; };
    if (op == '*') f = A;
    if (op == '/') f = [&](int64_t i) { return -A(i) / (B(i) * B(i)); };
    g[1] = reduce_to(shape, b.shape, d->data(), f);
  }
  return g;
}

std::vector<Floats> sigmoid(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0) || !c.want(0)) return g;
  Floats ky;
  const float* y = floats_of(c.out[0], ky);
  const float* d = c.d(0)->data();
  g[0].resize(c.d(0)->size());
  parallel_ranges(int64_t(g[0].size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) g[0][size_t(i)] = d[i] * y[i] * (1.0f - y[i]);
  });
  return g;
}

std::vector<Floats> pass_through(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (c.d(0) && c.want(0) && c.fwd.need(0).is_float()) g[0] = *c.d(0);
  return g;
}

// C[M, N] = Aᵀ B with A [R, M] and B [R, N], row-major, on the calling thread: a weight's gradient from
// its input rows and its output's gradient rows.
void gemm_tn(const float* A, const float* B, float* C, int64_t R, int64_t M, int64_t N, int64_t lda) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(M), int(N), int(R), 1.0f, A, int(lda), B, int(N), 0.0f, C,
              int(N));
}

// The same over the threads: row panels of C (columns of A) side by side, each one sgemm, so the sums do
// not depend on the thread count.
void gemm_tn_parallel(const float* A, const float* B, float* C, int64_t R, int64_t M, int64_t N) {
  const int64_t panel = 64, panels = (M + panel - 1) / panel;
  kernels::parallel_for(panels, [&](int64_t p) {
    const int64_t m0 = p * panel, m = std::min(panel, M - m0);
    gemm_tn(A + m0, B, C + m0 * N, R, m, N, M);
  });
}

// MatMul(A [..., M, K], B [K, N]) or both batched alike ([..., M, K] · [..., K, N]).
std::vector<Floats> matmul(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  const Floats* d = c.d(0);
  if (!d) return g;
  const Value& a = c.fwd.need(0);
  const Value& b = c.fwd.need(1);
  if (a.shape.size() < 2 || b.shape.size() < 2) c.fwd.fail("the reverse pass needs 2-D or batched operands");
  const int64_t K = a.shape.back(), N = b.shape.back();
  const int64_t M = a.shape[a.shape.size() - 2];
  const bool weight = b.shape.size() == 2;
  if (!weight && b.shape.size() != a.shape.size()) c.fwd.fail("the reverse pass needs B 2-D or batched like A");
  Floats ka, kb;
  const float* av = floats_of(&a, ka);
  const float* bv = floats_of(&b, kb);
  if (c.want(0)) g[0].assign(size_t(a.numel()), 0.0f);
  if (c.want(1)) g[1].assign(size_t(b.numel()), 0.0f);
  if (weight) {  // every row of A at once: dA = dY Bᵀ, dB = Aᵀ dY
    const int64_t rows = a.numel() / K;
    if (c.want(0)) matmul_parallel(d->data(), bv, g[0].data(), rows, N, K, /*b_transposed=*/true, 0);
    if (c.want(1)) gemm_tn_parallel(av, d->data(), g[1].data(), rows, K, N);
    return g;
  }
  kernels::parallel_for(a.numel() / (M * K), [&](int64_t i) {  // one product per batch, side by side
    if (c.want(0)) matmul_blas(d->data() + i * M * N, bv + i * K * N, g[0].data() + i * M * K, M, N, K, true, 0);
    if (c.want(1)) gemm_tn(av + i * M * K, d->data() + i * M * N, g[1].data() + i * K * N, M, K, N, K);
  });
  return g;
}

// The gradient of rows y = x / sqrt(mean(x²) + eps) · γ with respect to x, given dy; x as the forward summed
// it (the skip and bias added).
void rms_rows(const float* x, const float* gamma, const float* dy, float* dx, int64_t rows, int64_t width, float eps,
              bool accumulate) {
  kernels::parallel_for(rows, [&](int64_t r) {
    const float* xr = x + r * width;
    const float* dr = dy + r * width;
    float s2 = 0.0f;
    for (int64_t j = 0; j < width; ++j) s2 += xr[j] * xr[j];
    const double inv = 1.0 / std::sqrt(double(s2 / float(width) + eps));
    double gx = 0.0;
    for (int64_t j = 0; j < width; ++j) gx += double(dr[j]) * gamma[j] * xr[j];
    const double k = inv * inv * inv * gx / double(width);
    for (int64_t j = 0; j < width; ++j) {
      const float v = float(inv * double(dr[j]) * gamma[j] - k * xr[j]);
      dx[r * width + j] = accumulate ? dx[r * width + j] + v : v;
    }
  });
}

std::vector<Floats> simplified_norm(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0) || !c.want(0)) return g;
  const Value& x = c.fwd.need(0);
  const int64_t width = trailing_width(c.fwd, x);
  if (width != (x.shape.empty() ? 1 : x.shape.back())) c.fwd.fail("the reverse pass needs the last axis");
  Floats kx, kg;
  g[0].resize(size_t(x.numel()));
  rms_rows(floats_of(&x, kx), floats_of(&c.fwd.need(1), kg), c.d(0)->data(), g[0].data(), x.numel() / width, width,
           c.fwd.float_attr("epsilon", 1e-5f), false);
  return g;
}

// SkipSimplifiedLayerNormalization(input, skip, gamma, bias): y = rms(input + skip + bias) · γ, and output 3
// the sum itself.
std::vector<Floats> skip_simplified_norm(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  const Value& x = c.fwd.need(0);
  const int64_t width = x.shape.empty() ? 1 : x.shape.back(), n = x.numel();
  Floats sum(size_t(n), 0.0f);
  if (const Floats* d3 = c.d(3)) sum = *d3;
  if (c.d(0)) {
    Floats kx, ks, kb, kg;
    const float* xv = floats_of(&x, kx);
    const float* sv = floats_of(&c.fwd.need(1), ks);
    const float* bias = floats_of(c.fwd.input(3), kb);
    Floats s(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) s[size_t(i)] = xv[i] + sv[i] + (bias ? bias[i % width] : 0.0f);
    rms_rows(s.data(), floats_of(&c.fwd.need(2), kg), c.d(0)->data(), sum.data(), n / width, width,
             c.fwd.float_attr("epsilon", 1e-5f), true);
  }
  if (c.want(0)) g[0] = sum;
  if (c.want(1)) g[1] = sum;
  if (c.want(3)) {
    g[3].assign(size_t(width), 0.0f);
    for (int64_t i = 0; i < n; ++i) g[3][size_t(i % width)] += sum[size_t(i)];
  }
  return g;
}

// Split: the outputs' gradients laid side by side along the axis again (zero where none reaches an output).
std::vector<Floats> split(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.want(0)) return g;
  const Value& x = c.fwd.need(0);
  const size_t axis = size_t(normalize_axis(c.fwd, c.fwd.int_attr("axis", 0), x.shape.size()));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (size_t d = axis + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const int64_t width = x.shape[axis] * inner;
  g[0].assign(size_t(x.numel()), 0.0f);
  int64_t at = 0;  // the output's first column along the axis, times inner
  for (size_t k = 0; k < c.out.size(); ++k) {
    if (!c.out[k]) continue;
    const int64_t w = c.out[k]->shape[axis] * inner;
    if (const Floats* d = c.d(k))
      for (int64_t o = 0; o < outer; ++o) std::copy_n(d->data() + o * w, w, g[0].data() + o * width + at);
    at += w;
  }
  return g;
}

// Reshape, Squeeze, Unsqueeze, Flatten, Identity: the same elements in the same order.
std::vector<Floats> same_elements(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (c.d(0) && c.want(0)) g[0] = *c.d(0);
  return g;
}

// Row-major strides of a shape.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) st[i - 1] = st[i] * shape[i];
  return st;
}

// Transpose: y[i] = x[perm(i)], so dx[perm(i)] = dy[i].
std::vector<Floats> transpose(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0) || !c.want(0)) return g;
  const Value& x = c.fwd.need(0);
  const size_t rank = x.shape.size();
  std::vector<int64_t> perm = c.fwd.ints_attr("perm");
  if (perm.empty())
    for (size_t i = 0; i < rank; ++i) perm.push_back(int64_t(rank - 1 - i));
  const std::vector<int64_t> xs = strides_of(x.shape);
  std::vector<int64_t> out_shape(rank), step(rank);  // the output's axis i walks x's axis perm[i]
  for (size_t i = 0; i < rank; ++i) {
    const size_t p = size_t(normalize_axis(c.fwd, perm[i], rank));
    out_shape[i] = x.shape[p];
    step[i] = xs[p];
  }
  g[0].assign(size_t(x.numel()), 0.0f);
  const float* d = c.d(0)->data();
  std::vector<int64_t> idx(rank, 0);
  int64_t at = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    g[0][size_t(at)] = d[i];
    for (size_t k = rank; k-- > 0;) {
      if (++idx[k] < out_shape[k]) {
        at += step[k];
        break;
      }
      at -= step[k] * (out_shape[k] - 1);
      idx[k] = 0;
    }
  }
  return g;
}

// ReduceMean, ReduceSum: each input element gets its output's gradient (divided by the count for a mean).
std::vector<Floats> reduce(const VjpCall& c, bool mean) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0) || !c.want(0)) return g;
  const Value& x = c.fwd.need(0);
  const size_t rank = x.shape.size();
  std::vector<int64_t> axes = c.fwd.input(1) ? to_ints(*c.fwd.input(1)) : c.fwd.ints_attr("axes");
  std::vector<int64_t> kept = x.shape;  // the output's shape with the reduced axes kept as 1
  int64_t count = 1;
  for (size_t i = 0; i < rank; ++i) {
    const bool r = axes.empty() || std::count_if(axes.begin(), axes.end(), [&](int64_t a) {
                                     return size_t(normalize_axis(c.fwd, a, rank)) == i;
                                   }) > 0;
    if (r) {
      count *= x.shape[i];
      kept[i] = 1;
    }
  }
  const std::vector<int64_t> src = broadcast_sources(x.shape, kept);
  const float k = mean ? 1.0f / float(count) : 1.0f;
  g[0].resize(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) g[0][size_t(i)] = (*c.d(0))[size_t(src[size_t(i)])] * k;
  return g;
}

// Element-wise y = f(x) with dy/dx from x and y.
std::vector<Floats> unary(const VjpCall& c, float (*dydx)(float x, float y)) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0) || !c.want(0)) return g;
  Floats kx, ky;
  const float* x = floats_of(&c.fwd.need(0), kx);
  const float* y = floats_of(c.out[0], ky);
  const float* d = c.d(0)->data();
  g[0].resize(c.d(0)->size());
  parallel_ranges(int64_t(g[0].size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) g[0][size_t(i)] = d[i] * dydx(x[i], y[i]);
  });
  return g;
}

// Softmax over one axis (the last, as the engine runs it): dx = y ⊙ (dy − Σ y ⊙ dy) per row.
std::vector<Floats> softmax(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0) || !c.want(0)) return g;
  const Value& x = c.fwd.need(0);
  const size_t axis = size_t(normalize_axis(c.fwd, c.fwd.int_attr("axis", -1), x.shape.size()));
  if (axis + 1 != x.shape.size()) c.fwd.fail("the reverse pass needs the last axis");
  const int64_t w = x.shape.back(), rows = x.numel() / w;
  Floats ky;
  const float* y = floats_of(c.out[0], ky);
  const float* d = c.d(0)->data();
  g[0].resize(size_t(x.numel()));
  kernels::parallel_for(rows, [&](int64_t r) {
    double dot = 0.0;
    for (int64_t j = 0; j < w; ++j) dot += double(y[r * w + j]) * d[r * w + j];
    for (int64_t j = 0; j < w; ++j) g[0][size_t(r * w + j)] = y[r * w + j] * (d[r * w + j] - float(dot));
  });
  return g;
}

// Concat: each input's slice of the output's gradient.
std::vector<Floats> concat(const VjpCall& c) {
  std::vector<Floats> g = gradients_for(c);
  if (!c.d(0)) return g;
  const Value& y = *c.out[0];
  const size_t axis = size_t(normalize_axis(c.fwd, c.fwd.int_attr("axis", 0), y.shape.size()));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= y.shape[d];
  for (size_t d = axis + 1; d < y.shape.size(); ++d) inner *= y.shape[d];
  const int64_t width = y.shape[axis] * inner;
  int64_t at = 0;
  for (size_t k = 0; k < c.fwd.in.size(); ++k) {
    if (!c.fwd.in[k]) continue;
    const int64_t w = c.fwd.in[k]->shape[axis] * inner;
    if (c.want(k)) {
      g[k].resize(size_t(outer * w));
      for (int64_t o = 0; o < outer; ++o) std::copy_n(c.d(0)->data() + o * width + at, w, g[k].data() + o * w);
    }
    at += w;
  }
  return g;
}

}  // namespace

std::vector<Floats> group_query_attention_vjp(const VjpCall& c);  // vjp_attention.cc

namespace {
const std::map<std::string, VjpFn>& table() {
  static const std::map<std::string, VjpFn> t = {
      {":MatMul", matmul},
      {":Add", [](const VjpCall& c) { return binary(c, '+'); }},
      {":Sub", [](const VjpCall& c) { return binary(c, '-'); }},
      {":Mul", [](const VjpCall& c) { return binary(c, '*'); }},
      {":Div", [](const VjpCall& c) { return binary(c, '/'); }},
      {":Sigmoid", sigmoid},
      {":Cast", pass_through},
      {":Split", split},
      {":Reshape", same_elements},
      {":Squeeze", same_elements},
      {":Unsqueeze", same_elements},
      {":Flatten", same_elements},
      {":Identity", same_elements},
      {":Transpose", transpose},
      {":ReduceMean", [](const VjpCall& c) { return reduce(c, true); }},
      {":ReduceSum", [](const VjpCall& c) { return reduce(c, false); }},
      {":Sqrt", [](const VjpCall& c) { return unary(c, [](float, float y) { return 0.5f / y; }); }},
      {":Neg", [](const VjpCall& c) { return unary(c, [](float, float) { return -1.0f; }); }},
      {":Tanh", [](const VjpCall& c) { return unary(c, [](float, float y) { return 1.0f - y * y; }); }},
      {":Softmax", softmax},
      {":Concat", concat},
      {":SimplifiedLayerNormalization", simplified_norm},
      {"com.microsoft:SimplifiedLayerNormalization", simplified_norm},
      {"com.microsoft:SkipSimplifiedLayerNormalization", skip_simplified_norm},
      {"com.microsoft:GroupQueryAttention", group_query_attention_vjp},
  };
  return t;
}
}  // namespace

const VjpFn* find_vjp(const std::string& domain, const std::string& op_type) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  const auto it = table().find(d + ":" + op_type);
  return it == table().end() ? nullptr : &it->second;
}

}  // namespace nibble::forward

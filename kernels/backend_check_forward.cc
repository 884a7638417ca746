// The backend checks of the layer engine's forward operations against the reference (kernels/cpu
// forward_ref): each given its inputs on the backend (the engine's activations live there). Bit for bit
// where the arithmetic is the same (widen, round, select, the element-wise operators but tanh, erf and pow,
// the norms, whose sums run in the same order everywhere); where a product's summation order or a device's
// tanh / erf / pow differ, within the bound the check states.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"
#include "kernels/half_float.h"

namespace nibble::kernels {
namespace {

using check::Case;
using check::floats_of;
using check::same;


std::vector<float> normal(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(size_t(n), 0.0f);
  for (float& x : v) x = d(rng);
  return v;
}

Tensor view(const std::vector<float>& v, std::vector<int64_t> shape) {
  return host_view(DType::kFloat32, std::move(shape), v.data());
}

// |got - want| <= rel · scale[i] for every i (scale: the magnitude the sum was built from).
std::string within(const std::vector<float>& want, const std::vector<float>& got, const std::vector<float>& scale,
                   double rel, const std::string& what) {
  if (want.size() != got.size()) return what + ": " + std::to_string(got.size()) + " values";
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::isnan(want[i]) && std::isnan(got[i])) && !(std::fabs(double(got[i]) - want[i]) <= rel * scale[i]))
      return what + " differs at " + std::to_string(i) + ": " + std::to_string(got[i]) + ", reference " +
             std::to_string(want[i]) + " (bound " + std::to_string(rel) + " of " + std::to_string(scale[i]) + ")";
  return {};
}

std::string check_widen_round(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const std::vector<float> x = normal(257, 71, 3.0f);
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> bits;
    for (float f : x) bits.push_back(t == DType::kFloat16 ? float_to_half(f) : float_to_bf16(f));
    const Tensor h = host_view(t, {257}, bits.data());
    if (auto e = same(floats_of(r, r.forward_widen(h)), floats_of(g, g.forward_widen(g.upload(h))), "widened"); !e.empty())
      return e;
    const Tensor xf = view(x, {257});
    if (auto e = same(floats_of(r, r.forward_round(xf, t)), floats_of(g, g.forward_round(g.upload(xf), t)), "rounded");
        !e.empty())
      return e;
  }
  return {};
}

std::string check_select(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const std::vector<float> x = normal(6 * 40, 72);
  const std::vector<int64_t> counted{1, 0, 0, 1, 1, 0};
  const Tensor xt = view(x, {6, 40});
  return same(floats_of(r, r.forward_select_rows(xt, counted)),
              floats_of(g, g.forward_select_rows(g.upload(xt), counted)), "selected rows");
}

// A transpose of [2, 3, 4] to [4, 2, 3], every other column backwards from the last, a slice of rows.
std::string check_strided(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const std::vector<float> x = normal(24, 84);
  const Tensor xt = view(x, {2, 3, 4});
  Strided t;
  t.rank = 3;
  t.out[0] = 4, t.out[1] = 2, t.out[2] = 3, t.stride[0] = 1, t.stride[1] = 12, t.stride[2] = 4;
  Strided back;
  back.rank = 2;
  back.out[0] = 6, back.out[1] = 2, back.stride[0] = 4, back.stride[1] = -2, back.base = 3;
  Strided rows;
  rows.rank = 2;
  rows.out[0] = 2, rows.out[1] = 4, rows.stride[0] = 4, rows.stride[1] = 1, rows.base = 8;
  for (const Strided* s : {&t, &back, &rows})
    if (auto e = same(floats_of(r, r.forward_strided(xt, *s)), floats_of(g, g.forward_strided(g.upload(xt), *s)), "strided");
        !e.empty())
      return e;
  return {};
}

// Sums and means of rows, and softmaxed rows (with -inf entries, as a causal mask adds), bit for bit.
std::string check_rows(Backend& r, Backend& g, const Case&, const check::Weight&) {
  std::vector<float> x = normal(9 * 37, 85, 3.0f);
  x[5] = x[40] = -INFINITY;
  const Tensor xt = view(x, {9, 37});
  const std::vector<float> y = normal(9 * 37, 86);
  const Tensor yt = view(y, {9, 37});
  for (bool mean : {false, true})
    if (auto e = same(floats_of(r, r.forward_reduce_rows(yt, 37, mean)),
                      floats_of(g, g.forward_reduce_rows(g.upload(yt), 37, mean)), mean ? "row means" : "row sums");
        !e.empty())
      return e;
  return same(floats_of(r, r.forward_softmax_rows(xt, 37)), floats_of(g, g.forward_softmax_rows(g.upload(xt), 37)),
              "softmax rows");
}

// A batch of 6 products [2, 3] x [20, 16] · [16, 24], within the float32 bound relative to Σ|a||b|.
std::string check_batched(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const int64_t B = 6, M = 20, K = 16, N = 24;
  const std::vector<float> a = normal(B * M * K, 87), b = normal(B * K * N, 88);
  const Tensor at = view(a, {2, 3, M, K}), bt = view(b, {2, 3, K, N});
  const auto want = floats_of(r, r.forward_matmul_batched(at, bt));
  const auto got = floats_of(g, g.forward_matmul_batched(g.upload(at), g.upload(bt)));
  std::vector<float> mag(size_t(B * M * N), 0.0f);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          mag[size_t((i * M + m) * N + n)] += std::fabs(a[size_t((i * M + m) * K + k)] * b[size_t((i * K + k) * N + n)]);
  return within(want, got, mag, 1e-5, "batched products");
}

// Products of 300 rows (two row panels) against both layouts; the bound: float32 rounding over K terms,
// relative to Σ|a||b|.
std::string check_matmul(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const int64_t M = 300, K = 96, N = 40;
  const std::vector<float> a = normal(M * K, 73), b = normal(K * N, 74);
  for (bool tr : {false, true}) {
    const Tensor at = view(a, {3, 100, K}), bt = view(b, tr ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N});
    const std::vector<float> want = floats_of(r, r.forward_matmul(at, bt, tr));
    const std::vector<float> got = floats_of(g, g.forward_matmul(g.upload(at), g.upload(bt), tr));
    std::vector<float> mag(size_t(M * N), 0.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          mag[size_t(m * N + n)] += std::fabs(a[size_t(m * K + k)] * b[size_t(tr ? n * K + k : k * N + n)]);
    if (auto e = within(want, got, mag, 1e-5, tr ? "x wᵀ" : "x w"); !e.empty()) return e;
  }
  return {};
}

std::string check_binary(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const std::vector<float> a = normal(2 * 3 * 4, 75), b = normal(4, 76), c = normal(3, 77);
  std::vector<float> pos = a;
  for (float& x : pos) x = std::fabs(x) + 0.5f;
  struct Pair {
    const std::vector<float>* x;
    std::vector<int64_t> xs;
    const std::vector<float>* y;
    std::vector<int64_t> ys;
  };
  const Pair pairs[] = {{&a, {2, 3, 4}, &b, {4}}, {&a, {2, 3, 4}, &a, {2, 3, 4}}, {&c, {3, 1}, &b, {1, 4}}};
  for (ForwardBinary op : {ForwardBinary::kAdd, ForwardBinary::kSub, ForwardBinary::kMul, ForwardBinary::kDiv})
    for (const Pair& p : pairs) {
      const Tensor x = view(*p.x, p.xs), y = view(*p.y, p.ys);
      const auto want = floats_of(r, r.forward_binary(op, x, y)), got = floats_of(g, g.forward_binary(op, g.upload(x), g.upload(y)));
      if (auto e = same(want, got, "binary " + std::to_string(int(op))); !e.empty()) return e;
    }
  const std::vector<float> two{2.0f}, half{0.5f};
  // x² bit for bit; x^0.5 within 8 ulp of results near 1 (the CPU's powf is within 1 ulp, a GPU's powf
  // within a few: neither is correctly rounded).
  for (const auto* e : {&two, &half}) {
    const Tensor x = view(pos, {2, 3, 4}), y = view(*e, {1});
    const auto want = floats_of(r, r.forward_binary(ForwardBinary::kPow, x, y));
    const auto got = floats_of(g, g.forward_binary(ForwardBinary::kPow, g.upload(x), g.upload(y)));
    if (auto err = within(want, got, want, 9.6e-7, "pow"); !err.empty()) return err;
  }
  return {};
}

std::string check_unary(Backend& r, Backend& g, const Case&, const check::Weight&) {
  std::vector<float> x = normal(1000, 78, 4.0f);
  x[0] = 100.0f, x[1] = -100.0f, x[2] = 0.0f;  // exp's clamps
  const Tensor xt = view(x, {10, 100});
  for (int k = 0; k <= int(ForwardUnary::kGeluTanh); ++k) {
    const ForwardUnary op = ForwardUnary(k);
    const auto want = floats_of(r, r.forward_unary(op, xt)), got = floats_of(g, g.forward_unary(op, g.upload(xt)));
    const bool libm = op == ForwardUnary::kTanh || op == ForwardUnary::kErf || op == ForwardUnary::kGeluErf ||
                      op == ForwardUnary::kGeluTanh || op == ForwardUnary::kSqrt;
    std::vector<float> scale(want.size());
    for (size_t i = 0; i < want.size(); ++i) scale[i] = std::fabs(want[i]) + std::fabs(x[i]);
    const std::string e = libm ? within(want, got, scale, 5e-7, "unary " + std::to_string(k))
                               : same(want, got, "unary " + std::to_string(k));
    if (!e.empty()) return e;
  }
  return {};
}

std::string check_norm(Backend& r, Backend& g, const Case&, const check::Weight&) {
  const int64_t rows = 70, W = 48;
  const std::vector<float> x = normal(rows * W, 79), skip = normal(rows * W, 80), gamma = normal(W, 81),
                           beta = normal(W, 82), bias = normal(W, 83);
  for (int form = 0; form < 4; ++form)
    for (DType t : {DType::kFloat32, DType::kFloat16}) {
      NormArgs a;
      a.x = view(x, {rows, W});
      a.gamma = view(gamma, {W});
      a.width = W;
      a.round = t;
      a.rms = form != 2;
      a.l2 = form == 3;
      if (form == 1 || form == 2) a.skip = view(skip, {rows, W}), a.bias = view(bias, {W}), a.with_sum = true;
      if (form == 2) a.beta = view(beta, {W});
      NormArgs d = a;
      for (Tensor* p : {&d.x, &d.skip, &d.bias, &d.gamma, &d.beta})
        if (!p->empty()) *p = g.upload(*p);
      const auto want = r.forward_norm(a), got = g.forward_norm(d);
      if (want.size() != got.size()) return "outputs: " + std::to_string(got.size());
      for (size_t i = 0; i < want.size(); ++i)
        if (auto e = same(floats_of(r, want[i]), floats_of(g, got[i]), "norm form " + std::to_string(form)); !e.empty())
          return e;
    }
  return {};
}

}  // namespace

std::string check_forward_attention(Backend& r, Backend& g, const Case& c, const check::Weight& w);

std::vector<OpCheck> check_backend_forward(Backend& ref, Backend& b, const std::vector<Case>& cs) {
  const std::vector<Case> one{cs.front()};
  return {check::run_cases("forward_widen", ref, b, one, check_widen_round, 400),
          check::run_cases("forward_round", ref, b, one, check_widen_round, 400),
          check::run_cases("forward_select_rows", ref, b, one, check_select, 410),
          check::run_cases("forward_strided", ref, b, one, check_strided, 410),
          check::run_cases("forward_reduce_rows", ref, b, one, check_rows, 415),
          check::run_cases("forward_softmax_rows", ref, b, one, check_rows, 415),
          check::run_cases("forward_matmul", ref, b, one, check_matmul, 420),
          check::run_cases("forward_matmul_batched", ref, b, one, check_batched, 425),
          check::run_cases("forward_binary", ref, b, one, check_binary, 430),
          check::run_cases("forward_unary", ref, b, one, check_unary, 440),
          check::run_cases("forward_norm", ref, b, one, check_norm, 450),
          check::run_cases("forward_attention", ref, b, one, check_forward_attention, 460)};
}

}  // namespace nibble::kernels

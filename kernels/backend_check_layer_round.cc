// The backend checks of layer_round_weight and layer_round_step (kernels/layer_rounding.h): from RTN's
// scales and zero points, three sign steps against generated gradients, the problem uploaded once and the
// parameters left where each step put them. Every backend's offsets, factors and graph weights equal the
// reference's bit for bit (the same element bodies in the same order); the reference's starting weight is
// the dequantized RTN grid in the graph's scaling, and the steps keep v and f within their ranges.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"
#include "kernels/layer_rounding.h"

namespace nibble::kernels {
namespace {

using check::Case;
using check::floats_of;
using check::same;


std::vector<float> normal(int64_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// The starting graph weight computed here on its own: (clamp(rint(w / scale + z)) − z) · scale · (1/s_k · d_n).
std::string check_start(const LayerRoundProblem& p, const std::vector<float>& got) {
  const float lo = p.zero_point ? 0.0f : -float(1 << (p.bits - 1));
  const float hi = p.zero_point ? float((1 << p.bits) - 1) : float((1 << (p.bits - 1)) - 1);
  for (int64_t k = 0; k < p.K(); ++k)
    for (int64_t n = 0; n < p.N(); ++n) {
      const int64_t i = p.k_axis == 0 ? k * p.cols + n : n * p.cols + k;
      const int64_t q = p.k_axis == 0 ? (k / p.block) * p.cols + n : n * p.G() + k / p.block;
      const float scale = p.scale0.f32()[q];
      const float z = p.zero_point ? float(static_cast<const uint8_t*>(p.zero_points.data)[q]) : 0.0f;
      const float level = std::fmin(hi, std::fmax(lo, std::nearbyint(p.w.f32()[i] / scale + z)));
      float factor = p.s.empty() ? 1.0f : 1.0f / p.s.f32()[k];  // what the graph reads per unit of ŵ
      if (!p.divisor.empty()) factor *= p.divisor.f32()[n];
      const float want = (level - z) * scale * factor;
      if (got[size_t(i)] != want)
        return "start weight at (" + std::to_string(k) + ", " + std::to_string(n) + "): " + std::to_string(got[size_t(i)]) +
               ", the RTN grid's " + std::to_string(want);
    }
  return {};
}

std::string check_layer_round(Backend& r, Backend& g, const Case& c, const check::Weight& w) {
  const std::vector<float> ones(size_t(c.K), 1.0f);
  const std::vector<float> wf = floats_of(r, r.scale_weight_f32(w.m, ones.data()).tensor());
  QuantResult q;
  r.rtn(w.m, c.spec(), q);
  const std::vector<float> s = check::positive(c.K, 0.5f, 2.0f, 61), d = check::positive(c.N, 0.8f, 1.25f, 62);
  LayerRoundProblem p;
  p.rows = w.m.rows, p.cols = w.m.cols, p.k_axis = c.k_axis, p.block = c.block, p.bits = c.bits;
  p.zero_point = c.zero_point, p.scale_dtype = int(c.dtype);
  p.w = host_view(DType::kFloat32, {p.rows, p.cols}, wf.data());
  p.scale0 = host_view(DType::kFloat32, {int64_t(q.scales.size())}, q.scales.data());
  if (c.zero_point) p.zero_points = host_view(DType::kUInt8, {int64_t(q.zero_points.size())}, q.zero_points.data());
  p.s = host_view(DType::kFloat32, {c.K}, s.data());
  p.divisor = host_view(DType::kFloat32, {c.N}, d.data());
  LayerRoundProblem up = p;  // the backend reads its uploads at every step
  for (Tensor* t : {&up.w, &up.scale0, &up.zero_points, &up.s, &up.divisor})
    if (!t->empty()) *t = g.upload(*t);
  const std::vector<float> v0(size_t(c.K * c.N), 0.0f), f0(q.scales.size(), 0.0f);
  LayerRoundParams a{host_view(DType::kFloat32, {p.rows, p.cols}, v0.data()),
                     host_view(DType::kFloat32, {int64_t(f0.size())}, f0.data()), {}};
  LayerRoundParams x = a;
  if (auto e = check_start(p, floats_of(r, r.layer_round_weight(p, a))); !e.empty()) return e;
  const float sizes[] = {0.1f, 0.05f, 0.3f};
  for (uint32_t t = 0; t < 3; ++t) {
    std::vector<float> grad = normal(c.K * c.N, 1.0f, 70 + t);
    grad[3] = 0.0f;  // no step
    const Tensor gt = host_view(DType::kFloat32, {p.rows, p.cols}, grad.data());
    a = r.layer_round_step(p, a, gt, sizes[t]);
    x = g.layer_round_step(up, x, t == 1 ? g.upload(gt) : gt, sizes[t]);
    const std::string step = "step " + std::to_string(t) + ": ";
    const std::vector<float> av = floats_of(r, a.v), af = floats_of(r, a.f);
    if (auto e = same(av, floats_of(g, x.v), "offsets"); !e.empty()) return step + e;
    if (auto e = same(af, floats_of(g, x.f), "scale factors"); !e.empty()) return step + e;
    const std::vector<float> aw = floats_of(r, r.layer_round_weight(p, a));
    if (auto e = same(aw, floats_of(g, g.layer_round_weight(up, x)), "graph weight"); !e.empty()) return step + e;
    if (auto e = same(aw, floats_of(r, a.weight), "the reference step's weight"); !e.empty()) return step + e;
    if (auto e = same(aw, floats_of(g, x.weight), "the step's weight"); !e.empty()) return step + e;
    for (float v : av)
      if (!(std::fabs(v) <= layer_round::kOffsetRange)) return step + "an offset beyond 0.5";
    for (float f : af)
      if (!(std::fabs(f) <= layer_round::kScaleRange)) return step + "a scale factor beyond 0.2";
    if (t == 0 && av[3] != 0.0f) return step + "a zero gradient moved its offset";
  }
  return {};
}

}  // namespace

std::vector<OpCheck> check_backend_layer_round(Backend& ref, Backend& b, const std::vector<Case>& cs) {
  OpCheck step = check::run_cases("layer_round_step", ref, b, cs, check_layer_round, 90);
  OpCheck weight = step;  // one check covers both (a step is observable through the weight it gives)
  weight.op = "layer_round_weight";
  return {std::move(weight), std::move(step)};
}

}  // namespace nibble::kernels

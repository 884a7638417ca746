// forward_attention's backend check (backend_check_forward.cc): the present key and value (gathered,
// rotated, rounded) bit for bit; the context within 1e-5 of the largest |v| (its products are sums in
// another order, and a context is a convex combination of v's rows), and where it is rounded to fp16, one
// fp16 step more.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"

namespace nibble::kernels {
namespace {

std::vector<float> floats_back(Backend& b, const Tensor& t) {
  const std::vector<uint8_t> raw = b.download(t);
  std::vector<float> v(raw.size() / sizeof(float));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

std::vector<float> gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(size_t(n), 0.0f);
  for (float& x : v) x = d(rng);
  return v;
}

struct Form {
  bool packed, interleaved;
  int64_t Hq, Hkv, rot_half, window;
  float softcap;
  DType round;
};

std::string one_form(Backend& r, Backend& g, const Form& f) {
  AttentionArgs a;
  a.g.B = 2, a.g.S = 12, a.g.Hq = f.Hq, a.g.Hkv = f.Hkv, a.g.D = 16, a.g.rot_half = f.rot_half;
  a.g.window = f.window, a.g.softcap = f.softcap, a.g.interleaved = f.interleaved, a.g.packed = f.packed;
  a.g.scale = 0.25f, a.g.round = int(f.round);
  a.keys = {12, 7};
  const int64_t rows = a.g.B * a.g.S, D = a.g.D;
  const std::vector<float> q = gaussian(rows * (f.packed ? f.Hq + 2 * f.Hkv : f.Hq) * D, 90),
                           k = gaussian(rows * f.Hkv * D, 91), v = gaussian(rows * f.Hkv * D, 92),
                           cos = gaussian(a.g.S * f.rot_half, 93), sin = gaussian(a.g.S * f.rot_half, 94);
  a.query = host_view(DType::kFloat32, {a.g.B, a.g.S, int64_t(q.size()) / rows}, q.data());
  if (!f.packed) {
    a.key = host_view(DType::kFloat32, {a.g.B, a.g.S, f.Hkv * D}, k.data());
    a.value = host_view(DType::kFloat32, {a.g.B, a.g.S, f.Hkv * D}, v.data());
  }
  if (f.rot_half) {
    a.cos = host_view(DType::kFloat32, {a.g.S, f.rot_half}, cos.data());
    a.sin = host_view(DType::kFloat32, {a.g.S, f.rot_half}, sin.data());
  }
  AttentionArgs d = a;
  for (Tensor* t : {&d.query, &d.key, &d.value, &d.cos, &d.sin})
    if (!t->empty()) *t = g.upload(*t);
  const auto want = r.forward_attention(a), got = g.forward_attention(d);
  if (got.size() != 3) return "outputs: " + std::to_string(got.size());
  for (size_t i : {size_t(1), size_t(2)})
    if (auto e = check::same(floats_back(r, want[i]), floats_back(g, got[i]), i == 1 ? "present key" : "present value");
        !e.empty())
      return e;
  const auto vw = floats_back(r, want[2]);
  float vmax = 0.0f;
  for (float x : vw) vmax = std::max(vmax, std::fabs(x));
  const auto cw = floats_back(r, want[0]), cg = floats_back(g, got[0]);
  if (cw.size() != cg.size()) return "context: " + std::to_string(cg.size()) + " values";
  for (size_t i = 0; i < cw.size(); ++i) {
    const double bound = 1e-5 * vmax + (f.round == DType::kFloat16 ? std::ldexp(std::fabs(cw[i]), -10) : 0.0);
    if (!(std::fabs(double(cg[i]) - cw[i]) <= bound))
      return "context differs at " + std::to_string(i) + ": " + std::to_string(cg[i]) + ", reference " +
             std::to_string(cw[i]) + " (bound " + std::to_string(bound) + ")";
  }
  return {};
}

}  // namespace

std::string check_forward_attention(Backend& r, Backend& g, const check::Case&, const check::Weight&) {
  const Form forms[] = {{true, false, 4, 2, 8, -1, 0.0f, DType::kFloat32},
                        {false, true, 2, 2, 4, 5, 30.0f, DType::kFloat32},
                        {true, false, 4, 1, 8, -1, 0.0f, DType::kFloat16}};
  for (const Form& f : forms)
    if (auto e = one_form(r, g, f); !e.empty()) return e;
  return {};
}

}  // namespace nibble::kernels

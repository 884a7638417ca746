// The backend checks of the activation statistics: accumulate_statistics against the reference's plain
// float32 dot products (Σ|x| bit for bit: the same adds in the same order; XᵀX within the float32 products'
// rounding), and unpack_gram, gram_to_f32 and all_finite bit for bit, each given its input on the backend
// (the layer engine's statistics stay there).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "kernels/backend_check.h"
#include "kernels/backend_check_data.h"

namespace nibble::kernels {
namespace {

using check::Case;
using check::same;

template <class T>
std::vector<T> values_of(Backend& b, const Tensor& t) {
  const std::vector<uint8_t> raw = b.download(t);
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

std::vector<float> activations(int64_t n, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(size_t(n * K));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < K; ++k) x[size_t(r * K + k)] = d(rng) * (1.0f + float(k % 7));  // uneven channels
  return x;
}

// Two batches (the second longer than one product) into whole and block-diagonal sums; the bound on XᵀX is
// the float32 products' rounding over their rows, relative to Σ_r |x_ri x_rj|.
std::string check_accumulate(Backend& r, Backend& g, const Case& c, const check::Weight&) {
  const int64_t K = c.K, n1 = 300, n2 = kStatisticsRowsPerProduct + 50;
  const std::vector<float> x = activations(n1 + n2, K, 61);
  for (int64_t B : {int64_t(0), c.block}) {
    ActivationSums want, got;
    want.K = got.K = K;
    want.gram_block = got.gram_block = B;
    for (const auto& [off, n] : {std::pair<int64_t, int64_t>{0, n1}, {n1, n2}}) {
      const Tensor xt = host_view(DType::kFloat32, {n, K}, x.data() + off * K);
      r.accumulate_statistics(xt, want);
      g.accumulate_statistics(g.upload(xt), got);
    }
    if (got.rows != n1 + n2) return "rows " + std::to_string(got.rows);
    if (auto e = same(values_of<double>(r, want.sum_abs), values_of<double>(g, got.sum_abs), "sum |x|"); !e.empty())
      return e;
    const auto gw = values_of<double>(r, want.gram), gg = values_of<double>(g, got.gram);
    if (gw.size() != gg.size()) return "XᵀX: " + std::to_string(gg.size()) + " values";
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        if (B ? i / B != j / B : j < i) continue;
        const int64_t at = B ? (i / B) * B * B + (i % B) * B + j % B : packed_row(i, K) - i + j;
        double mag = 0;
        for (int64_t t = 0; t < n1 + n2; ++t) mag += std::fabs(double(x[size_t(t * K + i)]) * x[size_t(t * K + j)]);
        if (!(std::fabs(gg[size_t(at)] - gw[size_t(at)]) <= 1e-5 * mag))
          return "XᵀX (" + std::to_string(i) + ", " + std::to_string(j) + ") block " + std::to_string(B) + ": " +
                 std::to_string(gg[size_t(at)]) + ", reference " + std::to_string(gw[size_t(at)]) +
                 " (bound 1e-5 of Σ|x_i x_j|)";
      }
  }
  return {};
}

std::string check_unpack(Backend& r, Backend& g, const Case& c, const check::Weight&) {
  const int64_t K = c.K;
  const std::vector<double> whole = check::gram(40, K, 62);
  std::vector<double> packed;
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = i; j < K; ++j) packed.push_back(whole[size_t(i * K + j)]);
  const Tensor p = host_view(DType::kFloat64, {int64_t(packed.size())}, packed.data());
  const Tensor u = g.unpack_gram(g.upload(p), K);
  if (u.shape != std::vector<int64_t>{K, K}) return std::string("not K x K");
  return same(values_of<double>(r, r.unpack_gram(p, K)), values_of<double>(g, u), "unpacked XᵀX");
}

std::string check_to_f32(Backend& r, Backend& g, const Case& c, const check::Weight&) {
  std::vector<double> v = check::gram(40, c.K, 63);
  v[3] = 1.0 / 3.0;  // rounded
  const Tensor t = host_view(DType::kFloat64, {c.K, c.K}, v.data());
  return same(values_of<float>(r, r.gram_to_f32(t)), values_of<float>(g, g.gram_to_f32(g.upload(t))), "float32 G");
}

std::string check_finite(Backend& r, Backend& g, const Case& c, const check::Weight&) {
  std::vector<double> v = check::gram(40, c.K, 64);
  for (double bad : {0.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    if (bad != 0.0) v[size_t(c.K * c.K - 2)] = bad;  // in the last chunk of a device's flags
    const Tensor t = host_view(DType::kFloat64, {int64_t(v.size())}, v.data());
    const bool want = r.all_finite(t), got = g.all_finite(g.upload(t));
    if (want != (bad == 0.0) || got != want)
      return "all_finite with " + std::to_string(bad) + ": " + std::to_string(got);
  }
  return {};
}

}  // namespace

std::vector<OpCheck> check_backend_statistics(Backend& ref, Backend& b, const std::vector<Case>& cs) {
  const std::vector<Case> one{cs.front()};
  return {check::run_cases("accumulate_statistics", ref, b, one, check_accumulate, 300),
          check::run_cases("unpack_gram", ref, b, one, check_unpack, 310),
          check::run_cases("gram_to_f32", ref, b, one, check_to_f32, 320),
          check::run_cases("all_finite", ref, b, one, check_finite, 330)};
}

}  // namespace nibble::kernels

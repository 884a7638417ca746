#include "kernels/backend_check_data.h"

namespace nibble::kernels::check {

std::string Case::label() const {
  return dtype_name(dtype) + " k_axis " + std::to_string(k_axis) + " [K " + std::to_string(K) + ", N " +
         std::to_string(N) + "] block " + std::to_string(block) + " " + std::to_string(bits) + " bits" +
         (zero_point ? " zero point" : "");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int k_axis : {0, 1})
      for (int bits : {4, 8})
        for (bool zp : {false, true}) {
          out.push_back(Case{t, k_axis, 200, 37, 64, bits, zp});  // last block: 8 of 64 rows
          if (bits == 8 && !zp) out.push_back(Case{t, k_axis, 96, 33, 96, bits, zp});  // one block per column
        }
  return out;
}

Weight make_weight(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  const int64_t K = c.K, N = c.N;
  Weight w;
  const size_t esz = dtype_size(c.dtype);
  w.bytes.assign(size_t(K * N) * esz, 0);
  w.m = WeightMatrix{c.dtype, w.bytes.data(), c.k_axis == 0 ? K : N, c.k_axis == 0 ? N : K, c.k_axis};
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      float v = d(rng) * 0.05f;
      if (n == 3) v = 0.0f;                              // an all-zero column
      if (n == 5) v = 0.25f;                             // constant blocks
      if (n == 7 && k % 16 == 0) v = 7.0f * 0.05f;       // exact ties at 7/14 of the block max
      if (n == 9 && k == 1) v = 3.0f;                    // an outlier
      if ((k * 31 + n) % 97 == 0) v = -v * 8.0f;         // scattered large negatives
      store_float(c.dtype, w.bytes.data(), w.m.index(k, n), round_to(c.dtype, v));
    }
  return w;
}

std::vector<double> gram(int64_t T, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> x(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) x[size_t(t * K + k)] = d(rng) * (1.0 + double(k % 5));
  std::vector<double> g(size_t(K * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i) {
      const double xi = x[size_t(t * K + i)];
      for (int64_t j = 0; j < K; ++j) g[size_t(i * K + j)] += xi * x[size_t(t * K + j)];
    }
  return g;
}

std::vector<float> positive(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

OpCheck run_cases(const std::string& op, Backend& ref, Backend& b, const std::vector<Case>& cs, const Body& body,
                  uint32_t first_seed) {
  OpCheck r{op, 0, {}};
  uint32_t seed = first_seed;
  for (const Case& c : cs) {
    const Weight w = make_weight(c, seed++);
    std::string e;
    try {
      e = body(ref, b, c, w);
    } catch (const std::exception& ex) {
      e = std::string("threw: ") + ex.what();
    }
    ++r.cases;
    if (!e.empty()) {
      r.error = c.label() + ": " + e;
      break;
    }
  }
  return r;
}

}  // namespace nibble::kernels::check

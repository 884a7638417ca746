// Generated inputs of the backend checks (backend_check.cc): weights with ties, zero and constant
// blocks and outliers, Gram matrices of random tokens.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/backend_check.h"
#include "kernels/quant_types.h"

namespace nibble::kernels::check {

// A weight in its stored layout, owning its bytes.
struct Weight {
  std::vector<uint8_t> bytes;
  WeightMatrix m;
  std::string label;
};

struct Case {
  DType dtype;
  int k_axis;
  int64_t K, N, block;
  int bits;
  bool zero_point;
  std::string label() const;
  QuantSpec spec() const { return QuantSpec{bits, block, zero_point}; }
};

// The cases every quantizing operation runs: 3 dtypes x 2 layouts x {4 bits, 8 bits} x zero point on
// and off, with a partial last block (K = 200, block 64) and one whole-K block.
std::vector<Case> cases();

Weight make_weight(const Case& c, uint32_t seed);
// G = XᵀX (float64, K x K) of T random token rows, channel scales uneven.
std::vector<double> gram(int64_t T, int64_t K, uint32_t seed);
// A float32 tensor's values on the host (downloaded from backend b).
inline std::vector<float> floats_of(Backend& b, const Tensor& t) {
  const std::vector<uint8_t> raw = b.download(t);
  std::vector<float> v(raw.size() / sizeof(float));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}
// Positive values in [lo, hi).
std::vector<float> positive(int64_t n, float lo, float hi, uint32_t seed);

// Whether two arrays hold the same bits; "" when they do, else what differs first.
template <class T>
std::string same(const std::vector<T>& want, const std::vector<T>& got, const std::string& what) {
  if (want.size() != got.size())
    return what + ": " + std::to_string(got.size()) + " values, reference " + std::to_string(want.size());
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0)
      return what + " differs at " + std::to_string(i) + ": " + std::to_string(double(got[i])) + ", reference " +
             std::to_string(double(want[i]));
  return {};
}

// One check: runs `body` per case (a weight generated from first_seed on), stopping at the first
// difference, labelled with the case.
using Body = std::function<std::string(Backend& ref, Backend& b, const Case& c, const Weight& w)>;
OpCheck run_cases(const std::string& op, Backend& ref, Backend& b, const std::vector<Case>& cs, const Body& body,
                  uint32_t first_seed);

}  // namespace nibble::kernels::check

// Backend selection, and every backend against the reference kernels on the same inputs.
// (The CUDA backend's kernels land with issue 6; this file is where their parity tests go.)
#include <gtest/gtest.h>

#include <random>

#include "kernels/backend.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_ref.h"

using namespace nibble;
using namespace nibble::kernels;

TEST(Backend, CpuIsChosenWhenAsked) {
  std::string why;
  auto b = make_backend(Device::kCpu, &why);
  EXPECT_EQ(b->name(), "cpu");
  EXPECT_NE(why.find("cpu"), std::string::npos);
}

TEST(Backend, AutoFallsBackToCpuWithAReason) {
  std::string why;
  auto b = make_backend(Device::kAuto, &why);
  EXPECT_EQ(b->name(), "cpu");  // no CUDA kernels yet, on any machine
  EXPECT_NE(why.find("using CPU"), std::string::npos);
  EXPECT_THROW(make_backend(Device::kCuda, nullptr), std::runtime_error);
}

TEST(Backend, CpuBackendEqualsReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const int64_t K = 200, N = 37;
    std::vector<uint16_t> h(size_t(K * N));
    std::vector<float> f(size_t(K * N));
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = d(rng);
      h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
    }
    WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), K, N, 0};
    for (bool zp : {false, true}) {
      QuantSpec spec{4, 64, zp};
      QuantResult ref, got;
      rtn_quantize_ref(w, spec, ref);
      make_cpu_backend()->rtn(w, spec, got);
      EXPECT_EQ(ref.codes, got.codes);
      EXPECT_EQ(ref.scales, got.scales);
      // Scales are representable in the weight dtype.
      for (float s : got.scales) ASSERT_EQ(round_to(t, s), s);
    }
  }
}

// The fast CPU kernel against the reference: every code, scale, zero point and the error sum,
// bit for bit, over dtypes, layouts, block sizes (partial last blocks), bits and modes. The data
// hold exact .5 ties, zero blocks, constant blocks and outliers.
TEST(Backend, FastRtnEqualsReferenceBitForBit) {
  std::mt19937 rng(2024);
  std::normal_distribution<float> d;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int k_axis : {0, 1})
      for (int64_t bs : {16, 32, 128, 75, 300})  // 300 = K: one block per channel (INT8 layers)
        for (int bits : {4, 8})
          for (bool zp : {false, true}) {
            const int64_t K = 300, N = 270;  // not multiples of the tiles or the blocks
            std::vector<float> f(size_t(K * N));
            for (size_t i = 0; i < f.size(); ++i) {
              f[i] = d(rng) * (i % 97 == 0 ? 20.0f : 1.0f);
              if (i % 13 == 0) f[i] = 0.5f * float(int(i % 9) - 4);  // ties after scaling
            }
            for (int64_t k = 0; k < 40; ++k) f[size_t(k * N + 3)] = 0.0f;   // a zero block (axis 0)
            for (int64_t k = 0; k < 40; ++k) f[size_t(k * N + 5)] = 0.25f;  // a constant block
            std::vector<uint16_t> h(f.size());
            for (size_t i = 0; i < f.size(); ++i)
              h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
            const int64_t rows = k_axis == 0 ? K : N, cols = k_axis == 0 ? N : K;
            WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), rows, cols, k_axis};
            QuantSpec spec{bits, bs, zp};
            QuantResult ref, fast;
            rtn_quantize_ref(w, spec, ref);
            rtn_quantize_fast(w, spec, fast);
            SCOPED_TRACE(dtype_name(t) + " k_axis " + std::to_string(k_axis) + " bs " + std::to_string(bs) +
                         " bits " + std::to_string(bits) + (zp ? " zp" : " sym"));
            ASSERT_EQ(ref.groups, fast.groups);
            ASSERT_EQ(ref.codes, fast.codes);
            ASSERT_EQ(ref.scales, fast.scales);
            ASSERT_EQ(ref.zero_points, fast.zero_points);
            // Summation order differs (tiles), so the error sum agrees to rounding only.
            ASSERT_NEAR(ref.sq_error, fast.sq_error, 1e-9 * ref.sq_error);
          }
}

// The weighted clip search: fast kernel against the reference, bit for bit.
TEST(Backend, FastWeightedSearchEqualsReference) {
  std::mt19937 rng(99);
  std::normal_distribution<float> d;
  const std::vector<float> ratios = {1.0f, 0.9f, 0.875f, 0.75f, 0.5f};
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (bool zp : {false, true})
    for (int bits : {4, 8}) {
      const int64_t K = 200, N = 300;
      const int64_t bs = bits == 4 ? 64 : K;  // INT8 layers: per channel
      std::vector<float> f(static_cast<size_t>(K * N)), energy(static_cast<size_t>(K));
      for (auto& v : f) v = d(rng);
      for (auto& e : energy) e = std::fabs(d(rng)) + 0.01f;
      std::vector<uint16_t> h(f.size());
      for (size_t i = 0; i < f.size(); ++i) h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
      WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), K, N, 0};
      QuantSpec spec{bits, bs, zp};
      QuantResult ref, fast;
      rtn_quantize_weighted(w, spec, energy.data(), ratios, ref);
      rtn_quantize_weighted_fast(w, spec, energy.data(), ratios, fast);
      SCOPED_TRACE(dtype_name(t) + (zp ? " zp" : " sym") + " bits " + std::to_string(bits));
      ASSERT_EQ(ref.codes, fast.codes);
      ASSERT_EQ(ref.scales, fast.scales);
      ASSERT_EQ(ref.zero_points, fast.zero_points);
      // Weighted search never does worse than plain RTN on the weighted error.
      QuantResult plain;
      rtn_quantize_ref(w, spec, plain);
      auto werr = [&](const QuantResult& q) {
        double e = 0;
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) {
            const size_t pi = size_t((k / bs) * N + n);
            BlockParams p{q.scales[pi], zp ? q.zero_points[pi] : uint8_t(0)};
            const float x = load_float(t, w.data, size_t(k * N + n));
            const double dd = x - round_to(t, dequantize_value(q.codes[size_t(k * N + n)], p, bits, zp));
            e += energy[size_t(k)] * dd * dd;
          }
        return e;
      };
      EXPECT_LE(werr(fast), werr(plain) * (1 + 1e-9));
    }
}

// Backend selection, and every backend against the reference kernels on the same inputs.
// (Every operation on every backend, the CUDA backend included: test_backend_ops.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_ref.h"

using namespace nibble;
using namespace nibble::kernels;

TEST(Backend, CpuIsChosenWhenAsked) {
  std::string why;
  auto b = make_backend(BackendOptions{Device::kCpu}, &why);
  EXPECT_EQ(b->name(), "cpu");
  EXPECT_NE(why.find("cpu"), std::string::npos);
}

TEST(Backend, AutoFallsBackToCpuWithAReason) {
  std::string why;
  auto b = make_backend(BackendOptions{Device::kAuto}, &why);
  if (b->name() == "cuda") GTEST_SKIP() << "a CUDA device is present: " << why;
  EXPECT_EQ(b->name(), "cpu");  // never the emulated device: that one is chosen only explicitly
  EXPECT_NE(why.find("using CPU"), std::string::npos);
  EXPECT_THROW(make_backend(BackendOptions{Device::kCuda}, nullptr), std::runtime_error);
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
// Runs body once per instruction-set copy of the fast kernels this CPU has (portable, AVX2,
// AVX-512), then goes back to the automatic choice.
template <class F>
void for_each_isa(F&& body) {
  for (RtnIsa isa : rtn_fast_isas()) {
    rtn_fast_force_isa(isa);
    SCOPED_TRACE(std::string("isa ") + rtn_isa_name(isa));
    body();
    if (::testing::Test::HasFatalFailure()) break;
  }
  rtn_fast_force_isa(RtnIsa::kAuto);
}

TEST(Backend, FastRtnEqualsReferenceBitForBit) {
  for_each_isa([] {
  std::mt19937 rng(2024);
  std::normal_distribution<float> d;
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int k_axis : {0, 1})
      for (int64_t bs : {16, 32, 128, 75, 300})  // 300 = K: one block per channel (INT8 layers)
        for (int bits : {4, 8})
          for (int mode = 0; mode < 4; ++mode) {  // symmetric, zero point: as ModelOpt, as ONNX Runtime
            const bool zp = mode % 2 == 1;
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
            if (mode >= 2) spec.rtn_arithmetic = RtnArithmetic::kOnnxRuntime;
            QuantResult ref, fast;
            // A reused result (the pipeline hands the quantizer a written weight's codes): every code is
            // written again, none is left from before.
            fast.codes.assign(size_t(K * N) + 9, 0xa5);
            rtn_quantize_ref(w, spec, ref);
            rtn_quantize_fast(w, spec, fast);
            SCOPED_TRACE(dtype_name(t) + " k_axis " + std::to_string(k_axis) + " bs " + std::to_string(bs) +
                         " bits " + std::to_string(bits) + (zp ? " zp" : " sym") + (mode >= 2 ? " ort" : ""));
            ASSERT_EQ(ref.groups, fast.groups);
            ASSERT_EQ(ref.codes, fast.codes);
            ASSERT_EQ(ref.scales, fast.scales);
            ASSERT_EQ(ref.zero_points, fast.zero_points);
            // Each block's error summed alike; the blocks' sums are added in double in tiles of other
            // widths: exact here for fp16 weights, whose block sums are floats (24 significant bits).
            if (t == DType::kFloat16) {
              ASSERT_EQ(ref.sq_error, fast.sq_error);
            } else {
              ASSERT_NEAR(ref.sq_error, fast.sq_error, 1e-9 * ref.sq_error);
            }
          }
  });
}

// The weighted clip search: fast kernel against the reference, bit for bit.
TEST(Backend, FastWeightedSearchEqualsReference) {
  for_each_isa([] {
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
      // Exact ties between candidates (the first in the reference's order must win): an all-zero
      // column, and columns of ±1 and of one repeated value, where both signs of a scale tie.
      for (int64_t k = 0; k < K; ++k) {
        f[size_t(k * N)] = 0.0f;
        f[size_t(k * N + 1)] = (k % 3) ? 1.0f : -1.0f;
        f[size_t(k * N + 2)] = 0.75f;
      }
      for (auto& e : energy) e = std::fabs(d(rng)) + 0.01f;
      std::vector<uint16_t> h(f.size());
      for (size_t i = 0; i < f.size(); ++i) h[i] = t == DType::kFloat16 ? float_to_half(f[i]) : float_to_bf16(f[i]);
      WeightMatrix w{t, t == DType::kFloat32 ? static_cast<const void*>(f.data()) : h.data(), K, N, 0};
      QuantSpec spec{bits, bs, zp};
      QuantResult ref, fast;
      fast.codes.assign(size_t(K * N) + 9, 0xa5);  // reused: every code is written again
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
  });
}

// The combination nibble-mode AWQ runs (fp32 W ⊙ s, scales rounded to the weight's fp16/bf16), and
// energy rows that are NaN or inf (an fp16 activation that overflowed): no candidate beats +inf,
// and both kernels must keep candidate 0 rather than an unset scale.
TEST(Backend, FastWeightedSearchScaleDtypeAndNonFiniteEnergy) {
  for_each_isa([] {
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  const std::vector<float> ratios = {1.0f, 0.9f, 0.75f};
  const int64_t K = 96, N = 70;
  std::vector<float> f(static_cast<size_t>(K * N));
  for (auto& v : f) v = d(rng);
  for (DType sd : {DType::kFloat16, DType::kBFloat16})
    for (bool zp : {false, true})
      for (int bad : {0, 1, 2}) {  // 0: finite energy; 1: a NaN row in every block; 2: an inf row
        std::vector<float> energy(static_cast<size_t>(K));
        for (auto& e : energy) e = std::fabs(d(rng)) + 0.01f;
        if (bad)
          for (int64_t k = 5; k < K; k += 32) energy[size_t(k)] = bad == 1 ? NAN : INFINITY;
        WeightMatrix w{DType::kFloat32, f.data(), K, N, 0};
        QuantSpec spec{4, 32, zp};
        spec.scale_dtype = sd;
        QuantResult ref, fast;
        rtn_quantize_weighted(w, spec, energy.data(), ratios, ref);
        rtn_quantize_weighted_fast(w, spec, energy.data(), ratios, fast);
        SCOPED_TRACE(dtype_name(sd) + (zp ? " zp" : " sym") + " bad " + std::to_string(bad));
        ASSERT_EQ(ref.codes, fast.codes);
        ASSERT_EQ(ref.scales, fast.scales);
        ASSERT_EQ(ref.zero_points, fast.zero_points);
        if (bad) {  // every block (each holds a bad row) kept candidate 0: ratio 1, positive scale
          for (int64_t g = 0; g < K / 32; ++g)
            for (int64_t n = 0; n < N; ++n) {
              float amax = 0, mn = INFINITY, mx = -INFINITY;
              for (int64_t k = g * 32; k < g * 32 + 32; ++k) {
                const float v = f[size_t(k * N + n)];
                amax = std::max(amax, std::fabs(v));
                mn = std::min(mn, v);
                mx = std::max(mx, v);
              }
              const BlockParams p0 = zp ? block_params_zero_point(mn, mx, 4, sd) : block_params_symmetric(amax, 4, sd);
              ASSERT_EQ(fast.scales[size_t(g * N + n)], p0.scale) << g << "," << n;
              if (zp) {
                ASSERT_EQ(fast.zero_points[size_t(g * N + n)], p0.zero_point) << g << "," << n;
              }
            }
        }
      }
  });
}

namespace {

// fp16 weights given as bit patterns, [K, N] (k_axis 0) or transposed to [N, K] (k_axis 1).
void expect_fast_equals_ref_fp16(const std::vector<uint16_t>& kn, int64_t K, int64_t N, bool finite) {
  for (int k_axis : {0, 1}) {
    std::vector<uint16_t> h(kn.size());
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) h[size_t(k_axis == 0 ? k * N + n : n * K + k)] = kn[size_t(k * N + n)];
    WeightMatrix w{DType::kFloat16, h.data(), k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
    for (int bits : {4, 8})
      for (bool zp : {false, true})
        for (int64_t bs : {16, 32, 24}) {
          SCOPED_TRACE("k_axis " + std::to_string(k_axis) + " bits " + std::to_string(bits) + " bs " +
                       std::to_string(bs) + (zp ? " zp" : " sym"));
          const QuantSpec spec{bits, bs, zp};
          QuantResult ref, fast;
          rtn_quantize_ref(w, spec, ref);
          rtn_quantize_fast(w, spec, fast);
          // An Inf weight's own code is left out: w / s is then NaN, which the reference casts to
          // an integer as the hardware pleases and the fast kernel clamps to the lowest code.
          for (size_t i = 0; i < ref.codes.size(); ++i)
            if ((h[i] & 0x7c00) != 0x7c00) {
              ASSERT_EQ(int(ref.codes[i]), int(fast.codes[i])) << "element " << i << " = 0x" << std::hex << h[i];
            }
          ASSERT_EQ(ref.zero_points, fast.zero_points);
          ASSERT_EQ(ref.scales.size(), fast.scales.size());
          for (size_t i = 0; i < ref.scales.size(); ++i)  // bit patterns: NaN scales compare too
            ASSERT_EQ(float_to_half(ref.scales[i]), float_to_half(fast.scales[i])) << "scale " << i;
          if (finite) {
            ASSERT_TRUE(std::isfinite(ref.sq_error));
            ASSERT_EQ(ref.sq_error, fast.sq_error);
          } else {  // what the pipeline turns into "holds NaN or Inf values"
            ASSERT_FALSE(std::isfinite(ref.sq_error));
            ASSERT_FALSE(std::isfinite(fast.sq_error));
          }
        }
  }
}

}  // namespace

// fp16 corner cases of the branch-free fp16 rounding in the fast kernel, each column its own
// kind: exact .5 ties of w/s (before and after the quotient's rounding to fp16), subnormal
// weights and subnormal scales (ModelOpt's 1e-5 floor is an fp16 subnormal), weights near the
// fp16 maximum 65504 (dequantized values that round to inf), signed zeros.
TEST(Backend, FastRtnFp16EdgeCases) {
  const int64_t K = 72, N = 12;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> sub(1, 0x3ff), any(0, 0x7700);  // any: below 28672
  std::vector<uint16_t> kn(size_t(K * N));
  auto set = [&](int64_t k, int64_t n, float v) { kn[size_t(k * N + n)] = float_to_half(v); };
  for (int64_t k = 0; k < K; ++k) {
    const float sgn = k % 2 ? -1.0f : 1.0f;
    set(k, 0, sgn * (0.5f + float(k % 7)));             // amax 6.5..7 -> ties at s = 1
    set(k, 1, sgn * 0.25f * float(k % 29));             // quarter steps: ties at many scales
    kn[size_t(k * N + 2)] = uint16_t(sub(rng) | (k % 2 ? 0x8000 : 0));  // subnormal weights
    set(k, 3, sgn * std::ldexp(float(k % 5), -20));     // tiny block: the 1e-5 subnormal scale
    set(k, 4, sgn * std::ldexp(1.0f + float(k % 8) / 8, -15));  // scale ~ amax/7 subnormal
    set(k, 5, k % 3 ? 60000.0f : 1000.0f);               // large, finite after dequantization
    kn[size_t(k * N + 6)] = uint16_t(any(rng) | (k % 2 ? 0x8000 : 0));  // any half up to 28672
    set(k, 7, k % 2 ? 0.0f : -0.0f);                     // signed zeros
    set(k, 8, 1.0f + float(k) / 64);                     // one-sided block (zero point edge)
    set(k, 9, sgn * (k % 4 == 0 ? 7.0f * 1.5f : 1.5f * float(k % 7)));  // ties at s = 1.5
    set(k, 10, sgn * std::ldexp(float(k % 11) + 0.5f, -10));
    set(k, 11, 65504.0f / 7.0f * float(k % 8) / 7.0f);
  }
  for_each_isa([&] { expect_fast_equals_ref_fp16(kn, K, N, true); });

  // amax 65504: the scale is 9360 and 7 * 9360 = 65520 rounds to inf in fp16, as in numpy.
  std::vector<uint16_t> big(kn);
  for (int64_t k = 0; k < K; ++k) big[size_t(k * N + 5)] = float_to_half(k % 3 ? 65504.0f : -65504.0f + float(k));
  for_each_isa([&] { expect_fast_equals_ref_fp16(big, K, N, false); });

  // Inf weights: scale inf, every other code of the block as in the reference, error not finite.
  std::vector<uint16_t> inf(kn);
  inf[size_t(3 * N + 6)] = 0x7c00;
  inf[size_t(40 * N + 2)] = 0xfc00;
  for_each_isa([&] { expect_fast_equals_ref_fp16(inf, K, N, false); });
}

// NaN weights: the error sum is not finite in every copy (the pipeline refuses the weight), and
// the blocks without a NaN are quantized as the reference does. (Inside a NaN block the kernels
// may differ: the reference's amax keeps the NaN, the fast one's max skips it.)
TEST(Backend, FastRtnFp16NaNWeights) {
  const int64_t K = 64, N = 40;
  std::mt19937 rng(8);
  std::normal_distribution<float> d;
  std::vector<uint16_t> h(size_t(K * N));
  for (auto& v : h) v = float_to_half(d(rng));
  h[size_t(5 * N + 7)] = 0x7e00;   // NaN in block 0 of column 7
  h[size_t(50 * N + 30)] = 0xfe01;  // negative NaN with a payload, block 1 of column 30
  WeightMatrix w{DType::kFloat16, h.data(), K, N, 0};
  for_each_isa([&] {
    for (bool zp : {false, true}) {
      const QuantSpec spec{4, 32, zp};
      QuantResult ref, fast;
      rtn_quantize_ref(w, spec, ref);
      rtn_quantize_fast(w, spec, fast);
      EXPECT_FALSE(std::isfinite(ref.sq_error));
      EXPECT_FALSE(std::isfinite(fast.sq_error));
      for (int64_t g = 0; g < 2; ++g)
        for (int64_t n = 0; n < N; ++n) {
          if ((g == 0 && n == 7) || (g == 1 && n == 30)) continue;
          ASSERT_EQ(ref.scales[size_t(g * N + n)], fast.scales[size_t(g * N + n)]);
          for (int64_t k = g * 32; k < g * 32 + 32; ++k)
            ASSERT_EQ(ref.codes[size_t(k * N + n)], fast.codes[size_t(k * N + n)]);
        }
    }
  });
}

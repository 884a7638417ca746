// rtn_lsq_simd (kernels/cpu/rtn_lsq_fast.h) against rtn_lsq_ref bit for bit: every ISA copy this CPU
// runs, fp32/fp16/bf16, both layouts, 4 and 8 bits, with and without zero points, every weighting, on
// shapes that leave partial blocks and partial vectors, and on blocks of zeros, constants, huge and
// tiny values and non-finite ones; and the same bits whatever the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_lsq_fast.h"
#include "kernels/cpu/search_ref.h"
#include "kernels/parallel.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

struct Stored {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightMatrix w;
};

// Gaussian weights with outliers, and per column a kind of block: 0 plain, 1 all zero, 2 constant,
// 3 huge (~1e4, fp16's range), 4 tiny (~1e-6, below fp16's normals), 5 a single nonzero, 6 one sign.
Stored make(DType t, int64_t K, int64_t N, int k_axis, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Stored s;
  s.f32.resize(size_t(K * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      float v = d(rng) * (u(rng) < 0.02f ? 8.0f : 1.0f);
      switch (n % 11) {
        case 1: v = 0.0f; break;
        case 2: v = 0.125f; break;
        case 3: v *= 5e5f; break;
        case 4: v *= 5e-5f; break;
        case 5: v = k % 37 == 5 ? -0.3f : 0.0f; break;
        case 6: v = std::fabs(v) + 0.01f; break;
        default: break;
      }
      s.f32[size_t(k_axis == 0 ? k * N + n : n * K + k)] = v;
    }
  s.w = WeightMatrix{t, nullptr, k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
  if (t == DType::kFloat32) {
    s.w.data = s.f32.data();
  } else {
    s.half.resize(s.f32.size());
    for (size_t i = 0; i < s.f32.size(); ++i)
      s.half[i] = t == DType::kFloat16 ? float_to_half(s.f32[i]) : float_to_bf16(s.f32[i]);
    s.w.data = s.half.data();
  }
  return s;
}

uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}

void expect_identical(const QuantResult& a, const QuantResult& b, const std::string& what) {
  ASSERT_EQ(a.groups, b.groups) << what;
  ASSERT_EQ(a.codes.size(), b.codes.size()) << what;
  for (size_t i = 0; i < a.codes.size(); ++i) ASSERT_EQ(a.codes[i], b.codes[i]) << what << " code " << i;
  ASSERT_EQ(a.scales.size(), b.scales.size()) << what;
  for (size_t i = 0; i < a.scales.size(); ++i)
    ASSERT_EQ(f32_bits(a.scales[i]), f32_bits(b.scales[i]))
        << what << " scale " << i << " " << a.scales[i] << " " << b.scales[i];
  ASSERT_EQ(a.zero_points, b.zero_points) << what;
  EXPECT_TRUE(a.float_zero_points.empty() && b.float_zero_points.empty()) << what;
  EXPECT_EQ(bits_of(a.sq_error), bits_of(b.sq_error)) << what << " " << a.sq_error << " " << b.sq_error;
}

QuantSpec spec(int bits, int64_t block, bool zp) {
  QuantSpec s;
  s.bits = bits, s.block = block, s.zero_point = zp;
  return s;
}

const char* name(DType t) { return t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16"; }

}  // namespace

TEST(RtnLsqSimd, EqualsReferenceBitForBitOnEveryIsa) {
  set_num_threads(2);
  for (RtnIsa isa : rtn_fast_isas()) {
    rtn_fast_force_isa(isa);
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (int k_axis : {0, 1})
        for (int bits : {4, 8})
          for (bool zp : {false, true})
            for (FitWeight how : {FitWeight::kUniform, FitWeight::kSquare, FitWeight::kMagnitude}) {
              // K 203: a partial last block of 11 (block 64) or of 75 (block 128); N 45: 2 full vectors
              // of 16 channels and a partial one; block 5 is below fit::kLanes.
              const Stored s = make(t, 203, 45, k_axis, 17 + bits);
              for (int64_t block : {64, 128, 5}) {
                RtnSearchOptions o;
                o.weight = how;
                QuantResult a, b;
                rtn_lsq_ref(s.w, spec(bits, block, zp), o, a);
                rtn_lsq_simd(s.w, spec(bits, block, zp), o, b);
                expect_identical(a, b,
                                 std::string(rtn_isa_name(isa)) + " " + name(t) + " axis " + std::to_string(k_axis) +
                                     " bits " + std::to_string(bits) + " zp " + std::to_string(zp) + " weight " +
                                     std::to_string(int(how)) + " block " + std::to_string(block));
              }
            }
  }
  rtn_fast_force_isa(RtnIsa::kAuto);
  set_num_threads(0);
}

// A scale type other than the data's (nibble-mode AWQ quantizes an fp32 product of an fp16 weight), the
// other step counts, and a whole channel as one block.
TEST(RtnLsqSimd, EqualsReferenceWithScaleTypeStepsAndPerChannel) {
  const Stored s = make(DType::kFloat32, 300, 33, 0, 5);
  for (bool zp : {false, true})
    for (int steps : {0, 3, 9}) {
      QuantSpec sp = spec(4, 300, zp);
      sp.scale_dtype = DType::kFloat16;
      RtnSearchOptions o;
      o.weight = FitWeight::kMagnitude, o.steps = steps;
      QuantResult a, b;
      rtn_lsq_ref(s.w, sp, o, a);
      rtn_lsq_simd(s.w, sp, o, b);
      expect_identical(a, b, "per channel, fp16 scales, steps " + std::to_string(steps) + " zp " + std::to_string(zp));
    }
}

// Non-finite weights (the caller reports them through the error): the same scales, codes and a
// non-finite error.
TEST(RtnLsqSimd, NonFiniteWeightsAsTheReference) {
  Stored s = make(DType::kFloat32, 64, 20, 0, 9);
  s.f32[3 * 20 + 0] = NAN;
  s.f32[7 * 20 + 4] = INFINITY;
  s.f32[9 * 20 + 17] = -INFINITY;
  s.f32[50 * 20 + 18] = NAN;
  for (bool zp : {false, true}) {
    QuantResult a, b;
    rtn_lsq_ref(s.w, spec(4, 32, zp), RtnSearchOptions{}, a);
    rtn_lsq_simd(s.w, spec(4, 32, zp), RtnSearchOptions{}, b);
    EXPECT_FALSE(std::isfinite(a.sq_error));
    expect_identical(a, b, "non-finite zp " + std::to_string(zp));
  }
}

TEST(RtnLsqSimd, SameBitsWhateverTheThreadCount) {
  const Stored s = make(DType::kFloat16, 512, 100, 0, 3);
  for (bool zp : {false, true}) {
    RtnSearchOptions o;
    o.weight = FitWeight::kMagnitude;
    QuantResult one, two, three;
    set_num_threads(1);
    rtn_lsq_simd(s.w, spec(4, 128, zp), o, one);
    set_num_threads(2);
    rtn_lsq_simd(s.w, spec(4, 128, zp), o, two);
    set_num_threads(3);
    rtn_lsq_simd(s.w, spec(4, 128, zp), o, three);
    expect_identical(one, two, "1 vs 2 threads");
    expect_identical(one, three, "1 vs 3 threads");
  }
  set_num_threads(0);
}

// Shapes around the vector widths (4, 8, 16 channels) and fit::kLanes (8 elements): every ISA copy.
TEST(RtnLsqSimd, EqualsReferenceAroundTheVectorWidths) {
  for (RtnIsa isa : rtn_fast_isas()) {
    rtn_fast_force_isa(isa);
    for (int64_t N : {1, 3, 8, 16, 17, 32})
      for (int64_t K : {1, 7, 9, 24})
        for (int k_axis : {0, 1})
          for (bool zp : {false, true}) {
            const Stored s = make(DType::kFloat16, K, N, k_axis, uint32_t(K * 100 + N));
            for (int64_t block : {8, 16}) {
              RtnSearchOptions o;
              o.weight = FitWeight::kMagnitude;
              QuantResult a, b;
              rtn_lsq_ref(s.w, spec(4, block, zp), o, a);
              rtn_lsq_simd(s.w, spec(4, block, zp), o, b);
              expect_identical(a, b, std::string(rtn_isa_name(isa)) + " K " + std::to_string(K) + " N " +
                                         std::to_string(N) + " axis " + std::to_string(k_axis) + " zp " +
                                         std::to_string(zp) + " block " + std::to_string(block));
            }
          }
  }
  rtn_fast_force_isa(RtnIsa::kAuto);
}

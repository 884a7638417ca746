// The calibration-free per-block searches (rtn_lsq, hqq): the threaded CPU kernels against the scalar
// references bit for bit (threads 1 and 4), and what each search promises on real-looking weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/block_fit.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/cpu/search_fast.h"
#include "kernels/cpu/search_ref.h"
#include "kernels/lsq_grid.h"
#include "kernels/parallel.h"

using namespace nibble;
using namespace nibble::kernels;

namespace {

struct TestWeight {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightMatrix w;
};

// Gaussian weights with a few outliers per column (as LLM weights have), stored as k_axis says.
TestWeight make_weight(DType t, int64_t K, int64_t N, int k_axis, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  TestWeight tw;
  tw.f32.resize(size_t(K * N));
  for (auto& v : tw.f32) v = d(rng) * (u(rng) < 0.01f ? 6.0f : 1.0f) + 0.002f;
  tw.w = WeightMatrix{t, nullptr, k_axis == 0 ? K : N, k_axis == 0 ? N : K, k_axis};
  if (t == DType::kFloat16) {
    tw.half.resize(tw.f32.size());
    for (size_t i = 0; i < tw.f32.size(); ++i) tw.half[i] = float_to_half(tw.f32[i]);
    tw.w.data = tw.half.data();
  } else {
    tw.w.data = tw.f32.data();
  }
  return tw;
}

void expect_same(const QuantResult& a, const QuantResult& b) {
  EXPECT_EQ(a.codes, b.codes);
  ASSERT_EQ(a.scales.size(), b.scales.size());
  for (size_t i = 0; i < a.scales.size(); ++i) ASSERT_EQ(a.scales[i], b.scales[i]) << i;
  EXPECT_EQ(a.zero_points, b.zero_points);
  ASSERT_EQ(a.float_zero_points.size(), b.float_zero_points.size());
  for (size_t i = 0; i < a.float_zero_points.size(); ++i)
    ASSERT_EQ(a.float_zero_points[i], b.float_zero_points[i]) << i;
  EXPECT_NEAR(a.sq_error, b.sq_error, 1e-12 * a.sq_error);
}

QuantSpec spec(int bits, int64_t block, bool zp) {
  QuantSpec s;
  s.bits = bits, s.block = block, s.zero_point = zp;
  return s;
}

}  // namespace

TEST(Search, FastEqualsReferenceBitForBit) {
  for (DType t : {DType::kFloat32, DType::kFloat16})
    for (int k_axis : {0, 1})
      for (int bits : {4, 8})
        for (bool zp : {false, true})
          for (int threads : {1, 4}) {
            set_num_threads(threads);
            const TestWeight tw = make_weight(t, 200, 70, k_axis, 3);  // 200: a partial last block of 8
            QuantResult a, b;
            rtn_lsq_ref(tw.w, spec(bits, 64, zp), RtnSearchOptions{}, a);
            rtn_lsq_fast(tw.w, spec(bits, 64, zp), RtnSearchOptions{}, b);
            expect_same(a, b);
            if (!zp) continue;
            for (bool float_zero_point : {false, true})
              for (bool refit : {false, true}) {
                HqqOptions o;
                o.float_zero_point = float_zero_point, o.refit_scale = refit;
                hqq_ref(tw.w, spec(bits, 64, true), o, a);
                hqq_fast(tw.w, spec(bits, 64, true), o, b);
                expect_same(a, b);
                EXPECT_EQ(a.float_zero_points.size(), float_zero_point ? a.scales.size() : 0);
              }
          }
  set_num_threads(0);
}

// The search starts from 2^b-level RTN (symmetric: ONNX Runtime's grid; zero point: plain min/max) and
// only moves where the block's error falls: never worse per weight, and clearly better here.
TEST(Search, LsqNeverWorseThanItsStartAndBeatsModelOptsGrid) {
  const TestWeight tw = make_weight(DType::kFloat32, 512, 64, 0, 5);
  for (bool zp : {false, true}) {
    QuantResult lsq, rtn;
    rtn_lsq_ref(tw.w, spec(4, 128, zp), RtnSearchOptions{}, lsq);
    rtn_quantize_ref(tw.w, spec(4, 128, zp), rtn);  // ModelOpt's grid (symmetric: 15 levels)
    EXPECT_LT(lsq.sq_error, (zp ? 0.95 : 0.8) * rtn.sq_error) << "zp " << zp;
  }
  // Per block against the 16-level symmetric start.
  std::vector<float> x(128);
  for (int64_t n = 0; n < 64; ++n) {
    float m = 0;
    for (int64_t k = 0; k < 128; ++k) {
      x[size_t(k)] = tw.f32[size_t(k * 64 + n)];
      if (std::fabs(x[size_t(k)]) > std::fabs(m)) m = x[size_t(k)];
    }
    BlockParams start;
    start.scale = m / -8.0f;
    const BlockParams got = fit::lsq_symmetric(x.data(), 128, 4, DType::kFloat32, DType::kFloat32, RtnSearchOptions{});
    EXPECT_LE(fit::block_error(x.data(), 128, got, 4, false, DType::kFloat32, FitWeight::kUniform, 0),
              fit::block_error(x.data(), 128, start, 4, false, DType::kFloat32, FitWeight::kUniform, 0));
  }
}

// The grid search's premise: an element's code magnitude at grid point i, l0 plus its steps at
// positions <= i, is RTN's clamp(rint(|v_i| · |x| / amax)) at every point of the grid (exact
// ties aside, where float rounding may go either way).
TEST(Search, GridStepsAreRtnCodesAtEveryGridPoint) {
  const TestWeight tw = make_weight(DType::kFloat32, 128, 64, 0, 21);
  int64_t checked = 0, differ = 0;
  for (int64_t n = 0; n < 64; ++n) {
    std::vector<float> x(128);
    float m = 0, amax = 0;
    for (int64_t k = 0; k < 128; ++k) {
      x[size_t(k)] = tw.f32[size_t(k * 64 + n)];
      if (std::fabs(x[size_t(k)]) > amax) amax = std::fabs(x[size_t(k)]), m = x[size_t(k)];
    }
    {
      const lsq_grid::Family f = lsq_grid::family(4, 9);
      for (float v : x) {
        const lsq_grid::Element e = lsq_grid::element(f, v, 1.0f, amax, 1.0f / amax, (v < 0) == (m < 0));
        const float cap = (v < 0) == (m < 0) ? f.cap_same : f.cap_other;
        for (int i = 0; i < lsq_grid::kGrid; ++i) {
          const double vi = double(f.v0) + double(f.delta) * i, t = vi * std::fabs(double(v)) / double(amax);
          if (std::fabs(t - std::floor(t) - 0.5) < 1e-5) continue;  // a tie: float rounding may go either way
          const double rtn = std::min(double(cap), std::nearbyint(t));
          const double grid = e.l0 + (e.at1 <= float(i) ? 1 : 0) + (e.at2 <= float(i) ? 1 : 0);
          ++checked;
          differ += rtn != grid;
        }
      }
    }
  }
  EXPECT_GT(checked, 500000);  // 64 channels x 128 elements x 64 points, ties left out
  EXPECT_EQ(differ, 0);
}

// The codes are RTN's under the written scale and zero point: re-quantizing reproduces them.
TEST(Search, CodesAreRtnOfTheWrittenParameters) {
  const TestWeight tw = make_weight(DType::kFloat16, 256, 16, 1, 9);
  for (int which = 0; which < 3; ++which) {
    QuantResult q;
    if (which == 2) hqq_ref(tw.w, spec(4, 32, true), HqqOptions{}, q);
    else rtn_lsq_ref(tw.w, spec(4, 32, which == 1), RtnSearchOptions{}, q);
    const bool zp = which != 0;
    for (int64_t n = 0; n < 16; ++n)
      for (int64_t k = 0; k < 256; ++k) {
        BlockParams p;
        p.scale = q.scales[tw.w.param_index(q.groups, k / 32, n)];
        if (zp) p.zero_point = q.zero_points[tw.w.param_index(q.groups, k / 32, n)];
        const float v = load_float(DType::kFloat16, tw.w.data, tw.w.index(k, n));
        ASSERT_EQ(q.codes[tw.w.index(k, n)], quantize_value(v, p, 4, zp, DType::kFloat16)) << which << " " << k;
      }
  }
}

// HQQ on a block whose zero point the proximal steps move: the result is an integer zero point in
// range, its error close to plain min/max RTN's (HQQ minimises an lp norm, not the squared error).
TEST(Search, HqqZeroPointsInRangeAndErrorNearRtn) {
  const TestWeight tw = make_weight(DType::kFloat32, 512, 64, 0, 11);
  QuantResult h, r;
  hqq_ref(tw.w, spec(4, 128, true), HqqOptions{}, h);
  rtn_quantize_ref(tw.w, spec(4, 128, true), r);
  for (uint8_t z : h.zero_points) EXPECT_LE(z, 15);
  EXPECT_LT(h.sq_error, 1.2 * r.sq_error);
  QuantSpec sym = spec(4, 128, false);
  EXPECT_THROW(hqq_ref(tw.w, sym, HqqOptions{}, h), std::invalid_argument);
}

TEST(Search, ConstantAndZeroBlocks) {
  std::vector<float> w(64, 0.0f);
  for (int i = 32; i < 64; ++i) w[size_t(i)] = 0.25f;
  const WeightMatrix m{DType::kFloat32, w.data(), 64, 1, 0};
  for (bool zp : {false, true}) {
    QuantResult q;
    rtn_lsq_ref(m, spec(4, 32, zp), RtnSearchOptions{}, q);
    EXPECT_LT(q.sq_error, 1e-12) << zp;  // zeros exact; a constant block lands on a code
    EXPECT_GT(std::fabs(q.scales[0]), 0.0f);
  }
  QuantResult h;
  hqq_ref(m, spec(4, 32, true), HqqOptions{}, h);
  EXPECT_LT(h.sq_error, 1e-12);
  HqqOptions o;
  o.float_zero_point = true;
  hqq_ref(m, spec(4, 32, true), o, h);
  EXPECT_LT(h.sq_error, 1e-12);
  EXPECT_GT(h.scales[0], 0.0f);
}

// Float zero points (MatMulNBits): stored in the weight's type, each code the nearest level of
// (q - z)·s under the stored s and z, and the weight error below the integer zero point's.
TEST(Search, HqqFloatZeroPointsAreExactAndBeatIntegerOnes) {
  for (DType t : {DType::kFloat32, DType::kFloat16}) {
    const TestWeight tw = make_weight(t, 320, 48, 0, 13);  // 320: a partial last block of 64
    HqqOptions o;
    o.float_zero_point = true;
    QuantResult f, i;
    hqq_ref(tw.w, spec(4, 128, true), o, f);
    hqq_ref(tw.w, spec(4, 128, true), HqqOptions{}, i);
    ASSERT_EQ(f.zero_points.size(), f.scales.size());
    ASSERT_EQ(f.float_zero_points.size(), f.scales.size());
    int fractional = 0;
    for (size_t j = 0; j < f.scales.size(); ++j) {
      EXPECT_EQ(f.scales[j], round_to(t, f.scales[j]));
      EXPECT_EQ(f.float_zero_points[j], round_to(t, f.float_zero_points[j]));
      fractional += f.float_zero_points[j] != std::nearbyint(f.float_zero_points[j]);
    }
    EXPECT_GT(fractional, int(f.scales.size()) / 2);
    double err = 0;
    for (int64_t n = 0; n < 48; ++n)
      for (int64_t k = 0; k < 320; ++k) {
        const size_t pi = tw.w.param_index(f.groups, k / 128, n);
        const float s = f.scales[pi], z = f.float_zero_points[pi];
        const float v = load_float(t, tw.w.data, tw.w.index(k, n));
        const int c = f.codes[tw.w.index(k, n)];
        // no other code is nearer to v under (s, z)
        for (int d : {-1, 1}) {
          if (c + d < 0 || c + d > 15) continue;
          ASSERT_LE(std::fabs(v - (float(c) - z) * s), std::fabs(v - (float(c + d) - z) * s) * (1 + 1e-6f))
              << k << " " << n;
        }
        const double e = double(v) - double(round_to(t, (float(c) - z) * s));
        err += e * e;
      }
    EXPECT_NEAR(err, f.sq_error, 1e-9 * err);
    EXPECT_LT(f.sq_error, 0.97 * i.sq_error) << dtype_name(t);
  }
}

// The joint least-squares refit of s and z on the final codes never raises a block's error.
TEST(Search, HqqFloatRefitNeverWorsePerBlock) {
  const TestWeight tw = make_weight(DType::kFloat16, 256, 32, 1, 17);
  std::vector<float> x(64);
  HqqOptions plain, refit;
  plain.float_zero_point = refit.float_zero_point = true;
  refit.refit_scale = true;
  for (int64_t n = 0; n < 32; ++n)
    for (int64_t g = 0; g < 4; ++g) {
      for (int64_t k = 0; k < 64; ++k) x[size_t(k)] = load_float(DType::kFloat16, tw.w.data, tw.w.index(g * 64 + k, n));
      const auto a = fit::hqq_block_float(x.data(), 64, 4, DType::kFloat16, DType::kFloat16, plain);
      const auto b = fit::hqq_block_float(x.data(), 64, 4, DType::kFloat16, DType::kFloat16, refit);
      EXPECT_LE(fit::float_zero_error(x.data(), 64, b, 4, int(DType::kFloat16)),
                fit::float_zero_error(x.data(), 64, a, 4, int(DType::kFloat16)));
    }
}

// HQQ skips the power where the shrinkage is provably 0: below the threshold every float gives 0 when
// computed, the threshold lies within 2% of where the shrinkage starts, and none is claimed for p near 1.
TEST(Search, HqqShrinkageIsZeroBelowItsThreshold) {
  for (float beta : {10.0f, 12.0f, 1.0f, 100.0f, 1e4f})
    for (float p : {0.7f, 0.5f, 0.9f, 0.3f}) {
      const float c = 1.0f / beta, p1 = p - 1.0f;
      const float a = fit::hqq_no_shrink_below(c, p1);
      ASSERT_GT(a, 0.0f) << beta << " " << p;
      EXPECT_GT(fit::hqq_shrink(a * 1.03f, c, p1), 0.0f) << beta << " " << p;
      long checked = 0;
      const uint32_t top = f32_bits(a);
      for (uint32_t u = 0; u <= top; u += (u + 4096 > top ? 1 : 997), ++checked)  // the last 4096 floats all
        ASSERT_EQ(fit::hqq_shrink(bits_f32(u), c, p1), 0.0f) << beta << " " << p << " " << bits_f32(u);
      EXPECT_GT(checked, 900000);
    }
  EXPECT_EQ(fit::hqq_no_shrink_below(0.1f, -0.01f), -1.0f);
  EXPECT_EQ(fit::hqq_no_shrink_below(0.1f, 0.5f), -1.0f);
}

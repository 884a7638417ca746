// The layer learner's host-side helpers: the objective's token weights and the rounding base that makes a
// start's codes (GPTQ's) the nearest levels at zero offsets.
#include <gtest/gtest.h>

#include <cmath>

#include "calib/layer_learning.h"
#include "kernels/hd_float.h"

namespace nibble {
namespace {

TEST(TokenRowWeights, RowsAboveTheMedianWeighDownToIt) {
  // Four rows of two values: mean squares 1, 4, 100, 1e6 (median: the third, rows / 2 = 2 after sorting).
  const std::vector<float> t = {1, -1, 2, 2, 10, -10, 1000, 1000};
  const std::vector<float> w = token_row_weights(t.data(), t.size(), 2, true);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], 1.0f);
  EXPECT_EQ(w[2], 1.0f);  // the median row itself
  EXPECT_FLOAT_EQ(w[3], 100.0f / 1e6f);
  for (float x : token_row_weights(t.data(), t.size(), 2, false)) EXPECT_EQ(x, 1.0f);
}

TEST(RoundingBase, RoundsToTheStartsCodesNearestTheWeights) {
  // One input block of 8 channels, 1 output (K = 8, N = 1, k_axis 0), UINT4 with zero point 8, scale 0.5.
  LearnedWeight w;
  w.rows = 8, w.cols = 1, w.k_axis = 0;
  w.spec.block = 8, w.spec.bits = 4, w.spec.zero_point = true;
  w.scale_dtype = kernels::hd::kF32;
  w.w = {0.1f, 0.3f, -0.9f, 1.2f, 3.6f, -4.4f, 0.0f, 0.74f};
  w.q.scales = {0.5f};
  w.q.zero_points = {8};
  // Nearest levels: 8.2 -> 8, 8.6 -> 9, 6.2 -> 6, 10.4 -> 10, 15.2 -> 15 (clamped), -0.8 -> 0 (clamped), 8, 9.48 -> 9.
  // The start moved some: element 1 one level down, element 3 two up, element 4 stays at the top, element 7 at 9.
  w.q.codes = {8, 8, 6, 12, 15, 0, 8, 9};
  ASSERT_EQ(set_rounding_base(w), 0);
  ASSERT_EQ(w.base.size(), w.w.size());
  for (size_t i = 0; i < w.w.size(); ++i) {
    const float level = w.base[i] / 0.5f + 8.0f;
    const float rounded = std::fmin(15.0f, std::fmax(0.0f, std::nearbyint(level)));
    EXPECT_EQ(rounded, float(w.q.codes[i])) << i;
  }
  EXPECT_EQ(w.base[0], w.w[0]);  // its own code: its own value
  EXPECT_EQ(w.base[2], w.w[2]);
  EXPECT_EQ(w.base[4], w.w[4]);  // beyond the top level: clamped there anyway
  EXPECT_EQ(w.base[5], w.w[5]);
  EXPECT_NEAR(w.base[1] / 0.5f + 8.0f, 8.49f, 1e-5);   // moved down: at its level's edge toward the weight
  EXPECT_NEAR(w.base[3] / 0.5f + 8.0f, 11.51f, 1e-5);  // moved up two levels: the same, from below
}

}  // namespace
}  // namespace nibble

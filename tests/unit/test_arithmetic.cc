// host/algo/arithmetic.h: the choices that part nibble's arithmetic from ModelOpt's, per --awq_mode.
#include <gtest/gtest.h>

#include "host/algo/arithmetic.h"
#include "host/algo/modelopt_compat.h"
#include "loaders/error.h"

using namespace nibble;

namespace {

QuantizeOptions options(Algo algo, Arithmetic a, bool zero_point = false) {
  QuantizeOptions o;
  o.algo = algo;
  o.arithmetic = a;
  o.zero_point_flag = zero_point;
  return o;
}

}  // namespace

TEST(Arithmetic, ParsedFromAwqMode) {
  EXPECT_EQ(parse_awq_mode("modelopt"), Arithmetic::kModelOpt);
  EXPECT_EQ(parse_awq_mode("nibble"), Arithmetic::kNibble);
  EXPECT_STREQ(name_of(Arithmetic::kModelOpt), "modelopt");
  EXPECT_THROW(parse_awq_mode("numpy"), Error);
}

TEST(Arithmetic, PaddingAndRtnGrid) {
  EXPECT_TRUE(masks_padding(options(Algo::kAwqLite, Arithmetic::kNibble)));
  EXPECT_FALSE(masks_padding(options(Algo::kAwqLite, Arithmetic::kModelOpt)));
  EXPECT_TRUE(rtn_searches_scale(options(Algo::kRtnLsq, Arithmetic::kNibble)));
  EXPECT_FALSE(rtn_searches_scale(options(Algo::kRtnDq, Arithmetic::kNibble)));
  EXPECT_FALSE(rtn_searches_scale(options(Algo::kRtn, Arithmetic::kNibble)));
  EXPECT_FALSE(rtn_searches_scale(options(Algo::kAwqLite, Arithmetic::kNibble)));
  EXPECT_FALSE(rtn_searches_scale(options(Algo::kRtnDq, Arithmetic::kModelOpt)));
}

TEST(Arithmetic, PlainRtnIsOnnxRuntimesInNibbleMode) {
  using kernels::RtnArithmetic;
  for (Algo a : {Algo::kRtn, Algo::kRtnDq})
    for (bool zp : {false, true}) {
      EXPECT_EQ(rtn_arithmetic(options(a, Arithmetic::kNibble, zp), zp), RtnArithmetic::kOnnxRuntime);
      EXPECT_EQ(rtn_arithmetic(options(a, Arithmetic::kModelOpt, zp), zp), RtnArithmetic::kModelOpt);
    }
  // A calibrated method's symmetric fallback to plain RTN keeps ModelOpt's grid; with zero points it is ORT's.
  EXPECT_EQ(rtn_arithmetic(options(Algo::kAwqLite, Arithmetic::kNibble), false), RtnArithmetic::kModelOpt);
  EXPECT_EQ(rtn_arithmetic(options(Algo::kAwqLite, Arithmetic::kNibble, true), true), RtnArithmetic::kOnnxRuntime);
}

TEST(Arithmetic, ZeroPoints) {
  // ModelOpt's awq_clip writes symmetric INT4 whatever --use_zero_point says; nibble honours it.
  EXPECT_TRUE(writes_zero_point(options(Algo::kAwqClip, Arithmetic::kNibble, true)));
  EXPECT_FALSE(writes_zero_point(options(Algo::kAwqClip, Arithmetic::kModelOpt, true)));
  EXPECT_TRUE(writes_zero_point(options(Algo::kAwqFull, Arithmetic::kModelOpt, true)));
  EXPECT_FALSE(writes_zero_point(options(Algo::kAwqLite, Arithmetic::kModelOpt, false)));
  // Gather tables: ModelOpt gives them a zero point with awq_lite only.
  EXPECT_TRUE(gather_zero_point(options(Algo::kRtnDq, Arithmetic::kNibble, true)));
  EXPECT_FALSE(gather_zero_point(options(Algo::kRtnDq, Arithmetic::kModelOpt, true)));
  EXPECT_TRUE(gather_zero_point(options(Algo::kAwqLite, Arithmetic::kModelOpt, true)));
  EXPECT_FALSE(gather_zero_point(options(Algo::kAwqLite, Arithmetic::kNibble, false)));
}

TEST(Arithmetic, QuantizerAfterAwqAndClipCalibration) {
  EXPECT_EQ(awq_quantizer_clip_ratios(options(Algo::kAwqLite, Arithmetic::kNibble)), &block_clip_ratios());
  EXPECT_EQ(awq_quantizer_clip_ratios(options(Algo::kAwqLite, Arithmetic::kModelOpt)), nullptr);
  const Plan empty;
  EXPECT_EQ(search_calibration(options(Algo::kAwqClip, Arithmetic::kModelOpt), empty).sample_tokens,
            modelopt::kClipMaxTokens);
  EXPECT_EQ(modelopt::kClipMaxTokens, 64);
  EXPECT_EQ(search_calibration(options(Algo::kAwqClip, Arithmetic::kNibble), empty).sample_tokens, 0);
  EXPECT_EQ(search_calibration(options(Algo::kAwqLite, Arithmetic::kModelOpt), empty).sample_tokens, 0);
  // nibble's awq_clip keeps only the Gram matrix's diagonal blocks, in both arithmetics.
  EXPECT_EQ(search_calibration(options(Algo::kAwqClip, Arithmetic::kModelOpt), empty).gram_block, 128);
}

TEST(Arithmetic, WhatModelOptHasNot) {
  for (Algo a : {Algo::kHqq, Algo::kRtnSearch, Algo::kGptq, Algo::kAwqGptq}) {
    EXPECT_THROW(check_arithmetic(options(a, Arithmetic::kModelOpt)), Error);
    EXPECT_NO_THROW(check_arithmetic(options(a, Arithmetic::kNibble)));
  }
  QuantizeOptions o = options(Algo::kAwqFull, Arithmetic::kModelOpt);
  o.awqlite_run_per_subgraph = true;
  EXPECT_THROW(check_arithmetic(o), Error);
  o.arithmetic = Arithmetic::kNibble;
  EXPECT_NO_THROW(check_arithmetic(o));
  EXPECT_NO_THROW(check_arithmetic(options(Algo::kAwqClip, Arithmetic::kModelOpt)));
}

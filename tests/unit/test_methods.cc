// The method registry: one record per Algo, unique names that round-trip through the --algo parser, and
// the facts the stages read from it (what calibrates, what ModelOpt refuses, the default format, how it rounds
// and what it does with zero points).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "host/algo/arithmetic.h"
#include "host/methods.h"
#include "host/run/pipeline.h"
#include "loaders/error.h"

using namespace nibble;

TEST(Methods, OneRecordPerAlgo) {
  const int count = int(kLastAlgo) + 1;
  EXPECT_EQ(methods().size(), size_t(count));
  for (int i = 0; i < count; ++i) {
    int records = 0;
    for (const Method& m : methods()) records += m.algo == Algo(i);
    EXPECT_EQ(records, 1) << "Algo " << i;
    EXPECT_EQ(method(Algo(i)).algo, Algo(i));
  }
}

TEST(Methods, NamesAreUniqueAndRoundTrip) {
  std::set<std::string> names;
  for (const Method& m : methods()) {
    EXPECT_TRUE(names.insert(m.name).second) << m.name;
    EXPECT_STREQ(name_of(m.algo), m.name);
    EXPECT_EQ(parse_algo(m.name), m.algo);
    ASSERT_NE(find_method(m.name), nullptr);
    EXPECT_EQ(find_method(m.name), &m);
  }
  EXPECT_EQ(find_method("awq"), nullptr);
}

TEST(Methods, UnknownNameListsEveryMethod) {
  try {
    parse_algo("awq");
    FAIL() << "parse_algo accepted 'awq'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("--algo awq is unknown (choose ", 0), 0u) << msg;
    for (const Method& m : methods()) EXPECT_NE(msg.find(m.name), std::string::npos) << msg;
  }
}

TEST(Methods, WhatEachCalibrates) {
  EXPECT_FALSE(method(Algo::kRtnDq).calibrates());
  EXPECT_FALSE(method(Algo::kHqq).calibrates());
  EXPECT_TRUE(method(Algo::kAwqLite).measures.scale_search);
  EXPECT_TRUE(method(Algo::kAwqFull).measures.scale_search && method(Algo::kAwqFull).measures.clip_search);
  EXPECT_TRUE(method(Algo::kAwqGptq).measures.scale_search && method(Algo::kAwqGptq).measures.gptq);
  QuantizeOptions o;
  for (const Method& m : methods()) {
    o.algo = m.algo;
    EXPECT_EQ(o.searches_scales(), m.measures.scale_search) << m.name;
    EXPECT_EQ(o.searches_clip(), m.measures.clip_search) << m.name;
    EXPECT_EQ(o.uses_gptq(), m.measures.gptq) << m.name;
  }
}

TEST(Methods, ModelOptSupportAndDefaultFormat) {
  for (Algo a : {Algo::kAwqLite, Algo::kAwqClip, Algo::kAwqFull, Algo::kRtn, Algo::kRtnDq})
    EXPECT_EQ(method(a).modelopt_refusal, nullptr) << name_of(a);
  for (Algo a : {Algo::kRtnLsq, Algo::kRtnSearch, Algo::kGptq, Algo::kAwqGptq, Algo::kHqq})
    EXPECT_NE(method(a).modelopt_refusal, nullptr) << name_of(a);
  QuantizeOptions o;
  for (const Method& m : methods()) {
    o.algo = m.algo;
    EXPECT_EQ(o.resolved_format(), m.algo == Algo::kRtn ? Format::kQdq : Format::kDq) << m.name;
  }
  o.format = Format::kMatMulNBits;
  EXPECT_EQ(o.resolved_format(), Format::kMatMulNBits);
}

TEST(Methods, HelpHasEverySummary) {
  const std::string help = methods_help();
  for (const Method& m : methods())
    EXPECT_NE(help.find(std::string(m.name) + ": " + m.summary), std::string::npos) << m.name;
}

// A method's own rounding runs where no calibrated search quantizes, so only an uncalibrated method has one;
// fractional zero points are fitted, so written always; a policy other than optional says why.
TEST(Methods, RoundingRecordsAreConsistent) {
  for (const Method& m : methods()) {
    EXPECT_TRUE(m.rounding.quantizer == Quantizer::kRtn || !m.calibrates()) << m.name;
    EXPECT_TRUE(!m.rounding.fractional_zero_points || m.rounding.zero_point == ZeroPointPolicy::kAlways) << m.name;
    EXPECT_EQ(m.rounding.zero_point_why != nullptr, m.rounding.zero_point != ZeroPointPolicy::kOptional) << m.name;
    EXPECT_TRUE(!m.learned_rounding || m.measures.gptq) << m.name;  // it refines GPTQ's codes
  }
  EXPECT_EQ(method(Algo::kHqq).rounding.quantizer, Quantizer::kHqq);
  EXPECT_EQ(method(Algo::kRtnLsq).rounding.zero_point, ZeroPointPolicy::kRefused);
  EXPECT_TRUE(method(Algo::kAwqLearned).learned_rounding);
  EXPECT_EQ(method_names([](const Method& m) { return m.learned_rounding; }), "awq_learned");
  EXPECT_EQ(method_names([](const Method& m) { return m.measures.gptq; }), "gptq, awq_gptq and awq_learned");
}

// The zero-point policy is what the options and the option check do: always written, refused with the
// record's reason, or as --use_zero_point says.
TEST(Methods, ZeroPointPolicyIsWhatTheRunDoes) {
  for (const Method& m : methods()) {
    QuantizeOptions o;
    o.onnx_path = "in.onnx";
    o.output_path = "out.onnx";
    o.algo = m.algo;
    EXPECT_EQ(o.zero_point(), m.rounding.zero_point == ZeroPointPolicy::kAlways) << m.name;
    EXPECT_NO_THROW(validate_options(o)) << m.name;
    o.zero_point_flag = true;
    if (m.rounding.zero_point != ZeroPointPolicy::kRefused) {
      EXPECT_TRUE(o.zero_point()) << m.name;
      EXPECT_NO_THROW(validate_options(o)) << m.name;
      continue;
    }
    try {
      validate_options(o);
      ADD_FAILURE() << m.name << " took --use_zero_point";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--algo ") + m.name + " --use_zero_point: " + m.rounding.zero_point_why);
    }
  }
}

// nibble mode: with a zero point every plain RTN is ONNX Runtime's; without, the record's grid (ONNX Runtime's
// for rtn and rtn_dq only). modelopt mode: ModelOpt's always.
TEST(Methods, RtnGridIsTheRecords) {
  for (const Method& m : methods()) {
    QuantizeOptions o;
    o.algo = m.algo;
    EXPECT_EQ(rtn_arithmetic(o, false), m.rounding.symmetric_rtn) << m.name;
    EXPECT_EQ(rtn_arithmetic(o, true), kernels::RtnArithmetic::kOnnxRuntime) << m.name;
    o.arithmetic = Arithmetic::kModelOpt;
    EXPECT_EQ(rtn_arithmetic(o, false), kernels::RtnArithmetic::kModelOpt) << m.name;
    const bool ort = m.algo == Algo::kRtn || m.algo == Algo::kRtnDq;
    EXPECT_EQ(m.rounding.symmetric_rtn == kernels::RtnArithmetic::kOnnxRuntime, ort) << m.name;
  }
}

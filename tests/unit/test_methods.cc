// The method registry: one record per Algo, unique names that round-trip through the --algo parser, and
// the facts the stages read from it (what calibrates, what ModelOpt refuses, the default format).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "host/methods.h"
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

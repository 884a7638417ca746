// host/plan's layer index parser: normal names, the names that broke the std::regex + std::stoi
// version (digit runs that overflow an int, names of a megabyte), and agreement with that regex
// on ordinary names.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>

#include "host/graph/plan.h"

using nibble::layer_index;

TEST(Plan, LayerIndexOfUsualNames) {
  EXPECT_EQ(layer_index("/model/layers.12/attn/qkv_proj/MatMul"), 12);
  EXPECT_EQ(layer_index("/model/layers.0/mlp/up_proj/MatMul"), 0);
  EXPECT_EQ(layer_index("/transformer/h.7/attn/c_attn/MatMul"), 7);
  EXPECT_EQ(layer_index("/encoder/layer_3/dense/MatMul"), 3);
  EXPECT_EQ(layer_index("/blocks/5/ffn/MatMul"), 5);
  EXPECT_EQ(layer_index("model.layers.31"), 31);  // digits at the end of the name
  EXPECT_EQ(layer_index("/model/layers.007/attn/MatMul"), 7);
  EXPECT_EQ(layer_index("/lm_head/MatMul"), -1);
  EXPECT_EQ(layer_index(""), -1);
  EXPECT_EQ(layer_index("layers."), -1);
  EXPECT_EQ(layer_index("layers.x/1"), -1);
  // Digits followed by a letter do not count; a later match does.
  EXPECT_EQ(layer_index("/layers.12a/blocks.4/MatMul"), 4);
  // The first match wins, also inside words ("graph.3/": "h.3/").
  EXPECT_EQ(layer_index("/graph.3/layers.9/MatMul"), 3);
}

TEST(Plan, LayerIndexThatDoesNotFitIsMinusOne) {
  EXPECT_EQ(layer_index("/model/layers.2147483647/attn/MatMul"), 2147483647);
  EXPECT_EQ(layer_index("/model/layers.2147483648/attn/MatMul"), -1);
  EXPECT_EQ(layer_index("/model/layers.99999999999999999999/attn/MatMul"), -1);
  EXPECT_EQ(layer_index("/model/layers." + std::string(1 << 20, '9') + "/attn/MatMul"), -1);
  // Leading zeros do not overflow.
  EXPECT_EQ(layer_index("/model/layers." + std::string(1000, '0') + "42/attn/MatMul"), 42);
}

TEST(Plan, LayerIndexOfMegabyteNames) {
  const std::string junk(1 << 20, 'x');
  EXPECT_EQ(layer_index("/model/layers.3/" + junk + "/MatMul"), 3);
  EXPECT_EQ(layer_index("/" + junk + "/layers.17/MatMul"), 17);
  EXPECT_EQ(layer_index("/" + junk + "/MatMul"), -1);
  std::string seps;
  for (int i = 0; i < (1 << 18); ++i) seps += "h./";  // many near-matches
  EXPECT_EQ(layer_index(seps + "h.5"), 5);
  EXPECT_EQ(layer_index(std::string(1 << 20, '/')), -1);
}

// The old implementation's regex, on short random names made of the pieces that matter.
TEST(Plan, LayerIndexAgreesWithTheRegexOnShortNames) {
  const std::regex re(R"((?:layers|layer|blocks|h)[./_](\d+)(?:[./_]|$))");
  const char* pieces[] = {"layers", "layer", "blocks", "h", ".", "/", "_", "1", "23", "0", "a", "s", "model", "x9"};
  std::mt19937 rng(17);
  for (int t = 0; t < 20000; ++t) {
    std::string name;
    const int len = int(rng() % 8);
    for (int i = 0; i < len; ++i) name += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    std::smatch m;
    int want = -1;
    if (std::regex_search(name, m, re)) {  // at most 16 digits here: stoll fits
      const long long v = std::stoll(m[1]);
      want = v > 2147483647LL ? -1 : int(v);
    }
    ASSERT_EQ(layer_index(name), want) << name;
  }
}

// Mixed precision: ModelOpt's default INT8 layer choice, --layers_8bit
// matching and --mixed_budget parsing.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "host/algo/mixed_precision.h"
#include "loaders/error.h"

using namespace nibble;

namespace {

onnx::GraphProto genai_graph(int layers) {
  onnx::GraphProto g;
  auto add = [&](const std::string& name, const std::string& op = "MatMul") {
    auto* n = g.add_node();
    n->set_name(name);
    n->set_op_type(op);
  };
  for (int i = 0; i < layers; ++i) {
    const std::string p = "/model/layers." + std::to_string(i);
    add(p + "/attn/qkv_proj/MatMul");
    add(p + "/attn/o_proj/MatMul");
    add(p + "/mlp/gate_proj/MatMul");
    add(p + "/mlp/up_proj/MatMul");
    add(p + "/mlp/down_proj/MatMul");
    add(p + "/mlp/act/Mul", "Mul");
  }
  add("/lm_head/MatMul");
  return g;
}

std::set<int> layers_of(const std::set<std::string>& nodes, const std::string& role) {
  std::set<int> out;
  for (const auto& n : nodes)
    if (n.find(role) != std::string::npos) {
      const size_t a = n.find("layers.") + 7;
      out.insert(std::stoi(n.substr(a, n.find('/', a) - a)));
    }
  return out;
}

}  // namespace

TEST(Mixed, ModelOptDefaultChoice) {
  // §7.1's lists: first and last floor(n/8), every third between (phase 0).
  const std::map<int, std::set<int>> expected = {
      {16, {0, 1, 2, 5, 8, 11, 14, 15}},
      {28, {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 25, 26, 27}},
      {32, {0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 29, 30, 31}},
      {3, {0}},
  };
  for (const auto& [n, layers] : expected) {
    const auto nodes = modelopt_default_8bit_nodes(genai_graph(n));
    SCOPED_TRACE("n = " + std::to_string(n));
    EXPECT_EQ(layers_of(nodes, "/attn/qkv_proj/"), layers);
    EXPECT_EQ(layers_of(nodes, "/mlp/down_proj/"), layers);
    EXPECT_EQ(nodes.size(), 2 * layers.size());  // nothing else: no o/gate/up, no lm_head
  }
  // Other naming: nothing.
  onnx::GraphProto g;
  auto* n = g.add_node();
  n->set_name("/blocks.0/ffn/MatMul");
  n->set_op_type("MatMul");
  EXPECT_TRUE(modelopt_default_8bit_nodes(g).empty());
}

TEST(Mixed, LayerMatchingIsATokenSubsequence) {
  EXPECT_TRUE(layer_matches("/model/layers.1/attn/qkv_proj/MatMul", "layers.1"));
  EXPECT_FALSE(layer_matches("/model/layers.10/attn/qkv_proj/MatMul", "layers.1"));
  EXPECT_TRUE(layer_matches("/model/layers.10/mlp/down_proj/MatMul", "mlp/down_proj"));
  EXPECT_TRUE(layer_matches("/model/layers.10/mlp/down_proj/MatMul", "down_proj"));
  EXPECT_FALSE(layer_matches("/model/layers.10/mlp/down_proj/MatMul", "down"));
  EXPECT_TRUE(layer_matches("/model/layers.0/attn/qkv_proj/MatMul", "model/layers.0/attn/qkv_proj"));
  EXPECT_TRUE(layer_matches("/model/layers.0/attn/qkv_proj/MatMul", "/model/layers.0/attn/qkv_proj/MatMul"));
  EXPECT_FALSE(layer_matches("/model/layers.0/attn/qkv_proj/MatMul", "layers.0.mlp"));
}

TEST(Mixed, LayersOptionIsValidated) {
  EXPECT_EQ(parse_layers_8bit(" layers.0 , mlp/down_proj,lm_head "),
            (std::vector<std::string>{"layers.0", "mlp/down_proj", "lm_head"}));
  EXPECT_THROW(parse_layers_8bit("layers.0;rm"), Error);
  EXPECT_THROW(parse_layers_8bit("layers.0,,x"), Error);
  EXPECT_THROW(parse_layers_8bit(","), Error);
}

TEST(Mixed, BudgetParsing) {
  auto b = parse_mixed_budget("0.25");
  EXPECT_TRUE(b.is_share);
  EXPECT_DOUBLE_EQ(b.share, 0.25);
  EXPECT_TRUE(parse_mixed_budget("1").is_share);
  EXPECT_TRUE(parse_mixed_budget("0").is_share);
  EXPECT_EQ(parse_mixed_budget("300MB").bytes, 300000000u);
  EXPECT_EQ(parse_mixed_budget("1.5 GiB").bytes, 1610612736u);
  EXPECT_EQ(parse_mixed_budget("4096b").bytes, 4096u);
  for (const char* bad : {"", "1.5", "-0.1", "abc", "12XB", "nan", "-5MB", "MB"})
    EXPECT_THROW(parse_mixed_budget(bad), Error) << bad;
}

// The size a weight adds: hqq in MatMulNBits stores a float zero point per block (the weight's type),
// integer zero points take half a byte at 4 bits.
TEST(Mixed, WeightOutputBytesCountsFloatZeroPoints) {
  PlannedWeight pw;
  pw.rows = 576, pw.cols = 1536, pw.dtype = DType::kFloat16, pw.block = 128;
  const uint64_t N = 1536, G = 5, packed = N * G * 64, scales = N * G * 2;
  QuantizeOptions o;
  o.algo = Algo::kHqq;
  EXPECT_EQ(zero_points_of(o, Format::kMatMulNBits), ZeroPoints::kFloat);
  EXPECT_EQ(zero_points_of(o, Format::kDq), ZeroPoints::kCodes);
  o.algo = Algo::kRtnDq;
  EXPECT_EQ(zero_points_of(o, Format::kMatMulNBits), ZeroPoints::kNone);
  const auto bytes = [&](ZeroPoints z) {
    return weight_output_bytes(pw, 4, 128, Format::kMatMulNBits, z, SizeMode::kPayload);
  };
  EXPECT_EQ(bytes(ZeroPoints::kNone), packed + scales);
  EXPECT_EQ(bytes(ZeroPoints::kCodes), packed + scales + N * 3);
  EXPECT_EQ(bytes(ZeroPoints::kFloat), packed + scales + N * G * 2);
  // 8 bits (per channel: 9 blocks of 64, see matmulnbits_layout_block) keep integer zero points.
  EXPECT_EQ(weight_output_bytes(pw, 8, -1, Format::kMatMulNBits, ZeroPoints::kFloat, SizeMode::kPayload),
            weight_output_bytes(pw, 8, -1, Format::kMatMulNBits, ZeroPoints::kCodes, SizeMode::kPayload));
}

// Layer by layer, the 4-bit search runs on the plan as it was before the pick: the INT8 weights go back
// to 4 bits and the run's block; the activations searched again are those of the INT8 weights.
TEST(Mixed, FourBitPlanAndInt8Activations) {
  nibble::Plan plan;
  auto weight = [](const std::string& name, const std::string& act, int bits, int64_t block) {
    nibble::PlannedWeight pw;
    pw.weight = name;
    pw.activation = act;
    pw.bits = bits;
    pw.block = block;
    return pw;
  };
  plan.weights = {weight("q", "x0", 8, -1), weight("k", "x0", 4, 64), weight("down", "x1", 4, 64),
                  weight("up", "x2", 8, -1)};
  EXPECT_EQ(nibble::int8_activations(plan), (std::set<std::string>{"x0", "x2"}));
  const nibble::Plan four = nibble::at_four_bits(plan, 64);
  ASSERT_EQ(four.weights.size(), 4u);
  for (const auto& pw : four.weights) {
    EXPECT_EQ(pw.bits, 4) << pw.weight;
    EXPECT_EQ(pw.block, 64) << pw.weight;
  }
  EXPECT_TRUE(nibble::int8_activations(four).empty());
  EXPECT_EQ(plan.weights[0].bits, 8);  // the plan itself is unchanged
}

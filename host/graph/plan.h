// Which weights get quantized, and how: walks the graph for MatMul/Gemm nodes whose weight is a
// constant 2-D float initializer, applies --nodes_to_exclude, names each weight by layer and
// role, groups siblings that share an input, and records why anything else is left alone.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "loaders/onnx_model.h"

namespace nibble {

struct PlannedWeight {
  std::string weight;             // initializer name
  std::vector<int> nodes;         // indices of the consuming MatMul/Gemm nodes (graph order)
  std::string node_name;          // first consumer's name
  std::string op_type;            // first consumer's op
  std::string activation;         // first consumer's input[0]
  int k_axis = 0;                 // 0: stored [K, N]; 1: stored [N, K] (Gemm transB=1)
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kFloat32;
  bool keep_float = false;        // something else still reads the float initializer
  int layer = -1;                 // layer index parsed from the node name, -1 if none
  std::string role;               // e.g. "attn/qkv_proj"
  int bits = 4;
  int64_t block = 128;            // requested block (-1: per channel)
  std::string tied_to;            // a table: the planned MatMul/Gemm weight holding the same values

  int64_t K() const { return k_axis == 0 ? rows : cols; }
  int64_t N() const { return k_axis == 0 ? cols : rows; }
  int64_t resolved_block() const { return block < 0 ? K() : block; }
};

struct SkippedNode {
  std::string node;
  std::string op_type;
  std::string reason;
};

struct Plan {
  std::vector<PlannedWeight> weights;
  // Embedding tables: constant 2-D data of Gather nodes (op_type "Gather", nodes = the Gathers,
  // k_axis = the quantize axis, so the blocks and scale layouts are DequantizeLinear's).
  std::vector<PlannedWeight> gathers;
  std::vector<SkippedNode> skipped;
  std::map<std::string, std::vector<size_t>> siblings;  // activation -> weights reading it
};

struct PlanOptions {
  std::vector<std::string> nodes_to_exclude;  // regexes matched at the start of node names
  int64_t block_size = 128;
  int bits = 4;
  std::optional<int> gather_axis;  // absent: Gather data stays float
  int64_t gather_block = 32;
};

// --nodes_to_exclude compiled: (pattern, regex) pairs; Error for a bad regex.
using Excludes = std::vector<std::pair<std::string, std::regex>>;
Excludes compile_excludes(const std::vector<std::string>& patterns);
// The pattern that excludes node `name` (matched at its start), or null.
const std::string* excluded_by(const Excludes& excludes, const std::string& name);

// Throws Error for a bad regex or a weight nibble cannot take (fp64).
Plan make_plan(const OnnxModel& model, const PlanOptions& options);

// Layer index in a node name ("/model/layers.12/attn/qkv_proj/MatMul" -> 12): the digits after the
// first layers/layer/blocks/h + [./_] that end at [./_] or the end of the name; -1 when there is
// none or the number does not fit in an int. Linear time, any name length.
int layer_index(const std::string& node_name);

}  // namespace nibble

// The layer engine's reverse pass, for a learned method whose objective is a whole decoder layer's output
// error: each operator's vector-Jacobian product (given the gradient of a scalar objective with respect
// to a node's outputs, the gradient with respect to its float inputs), and a segment of the graph run
// forward with every value kept (a tape) and then backward, last node first, down to the weights asked.
//
// Host float32 only. Rounding to fp16 inside an operator passes the gradient straight through (the
// quantized weights' own rounding is the learned method's straight-through estimate too). The operators
// with a product (vjp_ops.cc): those of ONNX Runtime GenAI's Llama/Qwen layers (MatMul, Add, Sub, Mul, Div,
// Sigmoid, Cast between floats, SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization,
// GroupQueryAttention on a prompt). A segment holding any other operator cannot be differentiated
// (segment_without_vjp says which), and the learned method keeps its per-linear objective there. Only the
// activations and MatMul weights have gradients: nothing learns a norm's scale or the rotary caches.
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "forward/graph_run.h"
#include "forward/op_call.h"
#include "forward/value.h"

namespace nibble::forward {

struct VjpCall {
  OpCall fwd;                        // the node and its forward inputs (null where omitted): attributes, fail()
  std::vector<const Value*> out;     // the forward's outputs (null where the node leaves one out)
  std::vector<const Floats*> d_out;  // the objective's gradient per output (null: none reaches it)
  std::vector<bool> wanted;          // per input: its gradient is needed

  const Floats* d(size_t k) const { return k < d_out.size() ? d_out[k] : nullptr; }
  bool want(size_t k) const { return k < wanted.size() && wanted[k]; }
};

// Per forward input: its gradient (as many floats as the input has elements), empty where not wanted.
using VjpFn = std::function<std::vector<Floats>(const VjpCall&)>;

// The product of (domain, type), or null where the engine has none.
const VjpFn* find_vjp(const std::string& domain, const std::string& op_type);

// A segment [begin, end) of the graph run forward from a state, every value it reads or computes kept.
struct Tape {
  size_t begin = 0, end = 0;
  std::map<std::string, Value> values;  // by name: the state's live values at `begin`, and every result
};

// Advances s from s.next to `end` (GraphRun::advance), keeping the tape.
Tape run_taped(GraphRun& g, GraphRun::State& s, size_t end);

// The nodes in [begin, end) that read, directly or through other such nodes, one of `weights`.
std::set<size_t> nodes_depending_on(const GraphRun& g, size_t begin, size_t end, const std::set<std::string>& weights);
// "op_type (domain) at node 'name'" of the first of those nodes without a product, or empty.
std::string segment_without_vjp(const GraphRun& g, size_t begin, size_t end, const std::set<std::string>& weights);

// The gradient of the objective with respect to each initializer in `weights` (as many floats as the
// weight has elements; zero where no path reaches it), given its gradient with respect to some of the
// tape's values (`seeds`, by name). The nodes run last to first; each node's gradients add up in the
// order of its readers.
std::map<std::string, Floats> backward(GraphRun& g, const Tape& t, std::map<std::string, Floats> seeds,
                                       const std::set<std::string>& weights);

}  // namespace nibble::forward

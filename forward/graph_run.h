// Runs an ONNX graph node by node on the engine's operators (op_table.cc): the layer engine's interpreter.
// Initializers are views into the model's memory map; every intermediate value is dropped after its last
// reader, so memory holds the live activations only. The graph's nodes must be in topological order (as
// ONNX requires).
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "forward/value.h"
#include "loaders/onnx_model.h"

namespace nibble::forward {

class GraphRun {
 public:
  explicit GraphRun(OnnxModel& model);

  // "op_type (domain) at node 'name'" for every node whose operator the engine does not know; empty when
  // the engine can run the whole graph.
  std::vector<std::string> unsupported() const;

  // Called for every value in `capture` as soon as it is computed (before it may be dropped).
  using Capture = std::function<void(const std::string& name, const Value& value)>;
  // Runs the graph on `feeds` (graph inputs by name; an input without a feed is an empty value, as an
  // empty past key/value is); returns the values named in `keep` (graph outputs or intermediates).
  // Throws Error (one line) on a missing feed, an unknown operator or bad shapes.
  std::map<std::string, Value> run(const std::map<std::string, Value>& feeds, const std::set<std::string>& keep,
                                   const std::set<std::string>& capture, const Capture& on_capture);

  // Seconds spent per operator type in the last run (for the report).
  const std::map<std::string, double>& seconds_per_op() const { return seconds_; }

 private:
  OnnxModel& model_;
  std::map<std::string, Value> initializers_;  // views, made once
  std::map<std::string, int> readers_;         // how many node inputs read each name
  std::map<std::string, double> seconds_;
  const Value* initializer(const std::string& name);
};

}  // namespace nibble::forward

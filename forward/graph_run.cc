#include "forward/graph_run.h"

#include <chrono>

#include "forward/op_call.h"
#include "loaders/error.h"

namespace nibble::forward {

GraphRun::GraphRun(OnnxModel& model) : model_(model) {
  for (const auto& n : model_.proto().graph().node())
    for (const auto& i : n.input())
      if (!i.empty()) ++readers_[i];
}

std::vector<std::string> GraphRun::unsupported() const {
  std::vector<std::string> out;
  for (const auto& n : model_.proto().graph().node())
    if (!find_op(n.domain(), n.op_type()))
      out.push_back(n.op_type() + (n.domain().empty() ? "" : " (" + n.domain() + ")") + " at node '" + n.name() + "'");
  return out;
}

const Value* GraphRun::initializer(const std::string& name) {
  auto it = initializers_.find(name);
  if (it != initializers_.end()) return &it->second;
  const onnx::TensorProto* t = model_.initializer(name);
  if (!t) return nullptr;
  auto view = std::make_shared<TensorView>(model_.view(*t));
  Value v{view->dtype, view->dims, view->data, view};
  return &initializers_.emplace(name, std::move(v)).first->second;
}

std::map<std::string, Value> GraphRun::run(const std::map<std::string, Value>& feeds, const std::set<std::string>& keep,
                                           const std::set<std::string>& capture, const Capture& on_capture) {
  std::map<std::string, Value> live = feeds;
  std::map<std::string, int> left = readers_;
  std::map<std::string, Value> kept;
  const Value empty{};
  auto produced = [&](const std::string& name, Value v) {
    if (capture.count(name) && on_capture) on_capture(name, v);
    if (keep.count(name)) kept[name] = v;
    if (left.count(name)) live[name] = std::move(v);
  };
  for (const auto& [name, v] : feeds) produced(name, v);
  for (const auto& gi : model_.proto().graph().input())
    if (!live.count(gi.name()) && !model_.initializer(gi.name())) live[gi.name()] = empty;
  seconds_.clear();
  for (const auto& n : model_.proto().graph().node()) {
    const OpEntry* op = find_op(n.domain(), n.op_type());
    if (!op) throw Error("forward: node '" + n.name() + "': operator " + n.op_type() + " is not supported by the layer engine");
    OpCall call{n, {}, op->float32_on_cpu};
    std::vector<Value> rounded;  // inputs rounded for an operator with an fp16 kernel
    rounded.reserve(size_t(n.input_size()));
    for (const auto& i : n.input()) {
      if (i.empty()) {
        call.in.push_back(nullptr);
        continue;
      }
      auto it = live.find(i);
      const Value* v = it != live.end() ? &it->second : initializer(i);
      if (!v) throw Error("forward: node '" + n.name() + "' reads '" + i + "', which nothing produced");
      if (v->wide && !op->float32_on_cpu) {
        rounded.push_back(narrow(*v));
        v = &rounded.back();
      }
      call.in.push_back(v->present() ? v : nullptr);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Value> outs = op->fn(call);
    seconds_[n.op_type()] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& i : n.input())
      if (!i.empty() && --left[i] == 0) live.erase(i);
    for (int k = 0; k < n.output_size(); ++k)
      if (!n.output(k).empty() && size_t(k) < outs.size()) produced(n.output(k), std::move(outs[size_t(k)]));
  }
  return kept;
}

}  // namespace nibble::forward

// The segment's tape and reverse pass (forward/backward.h).
#include "forward/backward.h"

#include "loaders/error.h"

namespace nibble::forward {

Tape run_taped(GraphRun& g, GraphRun::State& s, size_t end) {
  Tape t;
  t.begin = s.next;
  t.end = end;
  t.values = s.live;  // shared bytes: a node never overwrites a value something else holds
  std::set<std::string> names;
  for (size_t i = s.next; i < end; ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty()) names.insert(o);
  g.advance(s, end, names, [&](const std::string& name, const Value& v) { t.values[name] = g.host_value(v); });
  return t;
}

std::set<size_t> nodes_depending_on(const GraphRun& g, size_t begin, size_t end, const std::set<std::string>& weights) {
  std::set<std::string> depends(weights.begin(), weights.end());
  std::set<size_t> nodes;
  for (size_t i = begin; i < end; ++i) {
    const onnx::NodeProto& n = g.node(i);
    bool d = false;
    for (const auto& in : n.input()) d = d || depends.count(in);
    // A value's shape or size does not change with its elements: nothing after it depends on the weights.
    if (!d || n.op_type() == "Shape" || n.op_type() == "Size") continue;
    nodes.insert(i);
    for (const auto& o : n.output()) depends.insert(o);
  }
  return nodes;
}

std::string segment_without_vjp(const GraphRun& g, size_t begin, size_t end, const std::set<std::string>& weights) {
  for (size_t i : nodes_depending_on(g, begin, end, weights)) {
    const onnx::NodeProto& n = g.node(i);
    if (!find_vjp(n.domain(), n.op_type()))
      return n.op_type() + " (" + (n.domain().empty() ? "ai.onnx" : n.domain()) + ") at node '" + n.name() + "'";
  }
  return {};
}

namespace {

// Adds a gradient into the map (the first one moves in).
void add_into(std::map<std::string, Floats>& grads, const std::string& name, Floats&& g) {
  auto it = grads.find(name);
  if (it == grads.end()) {
    grads.emplace(name, std::move(g));
    return;
  }
  if (it->second.size() != g.size()) throw Error("backward: gradients of '" + name + "' differ in size");
  for (size_t i = 0; i < g.size(); ++i) it->second[i] += g[i];
}

}  // namespace

std::map<std::string, Floats> backward(GraphRun& g, const Tape& t, std::map<std::string, Floats> seeds,
                                       const std::set<std::string>& weights) {
  // The values that depend on a weight: only their gradients are worth computing.
  std::set<std::string> depends(weights.begin(), weights.end());
  for (size_t i : nodes_depending_on(g, t.begin, t.end, weights))
    for (const auto& o : g.node(i).output()) depends.insert(o);
  std::map<std::string, Floats>& grads = seeds;
  for (size_t i = t.end; i-- > t.begin;) {
    const onnx::NodeProto& n = g.node(i);
    VjpCall c{OpCall{n, {}}, {}, {}, {}};
    bool any = false;
    for (const auto& o : n.output()) {
      const auto v = o.empty() ? t.values.end() : t.values.find(o);
      c.out.push_back(v == t.values.end() ? nullptr : &v->second);
      const auto d = o.empty() ? grads.end() : grads.find(o);
      c.d_out.push_back(d == grads.end() ? nullptr : &d->second);
      any = any || d != grads.end();
    }
    if (!any) continue;
    for (const auto& in : n.input()) {
      const Value* v = nullptr;
      if (!in.empty()) {
        const auto it = t.values.find(in);
        v = it != t.values.end() ? &it->second : g.weight(in);
        if (!v) throw Error("backward: node '" + n.name() + "' reads '" + in + "', which the tape does not hold");
      }
      c.fwd.in.push_back(v && v->present() ? v : nullptr);
      c.wanted.push_back(!in.empty() && depends.count(in) && v && v->present() && v->is_float());
    }
    const VjpFn* f = find_vjp(n.domain(), n.op_type());
    if (!f) throw Error("backward: no reverse pass for " + n.op_type() + " at node '" + n.name() + "'");
    std::vector<Floats> d_in = (*f)(c);
    for (int k = 0; k < n.input_size(); ++k) {
      if (!c.wanted[size_t(k)]) continue;
      if (size_t(k) >= d_in.size() || d_in[size_t(k)].empty())  // a norm's scale, the rotary caches
        throw Error("backward: no gradient for input " + std::to_string(k) + " of " + n.op_type() + " node '" +
                    n.name() + "'");
      add_into(grads, n.input(k), std::move(d_in[size_t(k)]));
    }
    for (const auto& o : n.output()) grads.erase(o);  // consumed: no node before this one reads it
  }
  std::map<std::string, Floats> out;
  for (const auto& w : weights) {
    auto it = grads.find(w);
    if (it != grads.end()) {
      out[w] = std::move(it->second);
    } else if (const Value* v = g.weight(w)) {
      out[w] = Floats(size_t(v->numel()), 0.0f);
    }
  }
  return out;
}

}  // namespace nibble::forward

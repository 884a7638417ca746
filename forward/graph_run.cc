#include "forward/graph_run.h"

#include <algorithm>
#include <chrono>

#include <cstring>

#include "forward/device_ops.h"
#include "forward/op_call.h"
#include "loaders/error.h"

namespace nibble::forward {

GraphRun::GraphRun(OnnxModel& model) : model_(model) {
  const auto& nodes = model_.proto().graph().node();
  for (int k = 0; k < nodes.size(); ++k) {
    for (const auto& i : nodes[k].input())
      if (!i.empty()) ++readers_[i];
    for (const auto& o : nodes[k].output())
      if (!o.empty()) producers_[o] = size_t(k);
  }
}

size_t GraphRun::producer(const std::string& name) const {
  const auto it = producers_.find(name);
  if (it != producers_.end()) return it->second;
  for (const auto& gi : model_.proto().graph().input())
    if (gi.name() == name) return nodes();
  if (model_.initializer(name)) return nodes();
  throw Error("forward: the graph computes no value named '" + name + "'");
}

std::vector<std::string> GraphRun::unsupported() const {
  std::vector<std::string> out;
  for (const auto& n : model_.proto().graph().node())
    if (!find_op(n.domain(), n.op_type()))
      out.push_back(n.op_type() + (n.domain().empty() ? "" : " (" + n.domain() + ")") + " at node '" + n.name() + "'");
  return out;
}

const Value* GraphRun::initializer(const std::string& name) {
  read_.insert(name);
  if (auto o = overrides_.find(name); o != overrides_.end()) return &o->second;
  auto it = initializers_.find(name);
  if (it != initializers_.end()) {
    // Read again (the next batch): widened once and kept, within the budget. On a device they go up as
    // they are and are widened there (half the bytes across the bus).
    Value& v = it->second;
    if (!device_ && !v.wide && (v.dtype == DType::kFloat16 || v.dtype == DType::kBFloat16) &&
        widened_bytes_ + size_t(v.numel()) * 4 <= kWidenedBudget) {
      v = from_floats(v.dtype, v.shape, to_floats(v), /*wide=*/true);  // exact: every fp16/bf16 value is a float32
      widened_bytes_ += v.bytes();
    }
    return &v;
  }
  const onnx::TensorProto* t = model_.initializer(name);
  if (!t) return nullptr;
  auto view = std::make_shared<TensorView>(model_.view(*t));
  views_.push_back(view);
  return &initializers_.emplace(name, Value{view->dtype, view->dims, view->data, view, false, {}}).first->second;
}

void GraphRun::release_weights() {
  initializers_.clear();
  device_initializers_.clear();
  device_uploads_.clear();
  device_upload_bytes_ = 0;
  lent_.clear();
  widened_bytes_ = 0;
  Floats().swap(weight_scratch_);
  for (const auto& v : views_)
    if (v->external) model_.release(*v);
  views_.clear();
}

GraphRun::State GraphRun::start(const std::map<std::string, Value>& feeds, const std::set<std::string>& capture,
                                const Capture& on_capture) {
  State s;
  s.left = readers_;
  for (const auto& [name, v] : feeds) {
    if (capture.count(name) && on_capture) on_capture(name, v);
    if (s.left.count(name)) s.live[name] = v;
  }
  for (const auto& gi : model_.proto().graph().input())
    if (!s.live.count(gi.name()) && !model_.initializer(gi.name()) && s.left.count(gi.name())) s.live[gi.name()] = Value{};
  return s;
}

Value GraphRun::device_value(const Value& v, const std::string& name, bool is_initializer) {
  if (is_initializer) {
    if (auto it = device_initializers_.find(name); it != device_initializers_.end()) return it->second;
    if (auto it = shared_initializers_.find(name); it != shared_initializers_.end()) return it->second;
  }
  const bool lent = is_initializer && !overrides_.count(name) && lent_.count(name);
  kernels::Tensor d = lent ? lent_.at(name) : device_->upload(kernels::host_view(v.storage(), v.shape, v.data));
  if (!is_initializer) activation_upload_bytes_ += v.bytes();
  if (is_initializer && !lent && d.buffer && !overrides_.count(name) &&
      device_upload_bytes_ + d.bytes() <= device_->device_memory().budget / 4) {
    device_uploads_[name] = d;  // the search's copy of this weight (Calibration::take_device_weights)
    device_upload_bytes_ += d.bytes();
  }
  if (v.storage() != DType::kFloat32) d = device_->forward_widen(d);
  Value r = v;  // keeps `hold`: the host bytes stay while their upload may be in flight
  r.data = nullptr;
  r.device = std::move(d);
  r.device.shape = device_shape(v.shape);
  if (is_initializer) (readers_[name] > 1 ? shared_initializers_ : device_initializers_)[name] = r;
  return r;
}

Value GraphRun::host_value(const Value& v) const {
  if (!v.on_device()) return v;
  const std::vector<uint8_t> raw = device_->download(v.device);
  Floats f(raw.size() / sizeof(float));
  std::memcpy(f.data(), raw.data(), raw.size());
  return from_floats(v.dtype, v.shape, std::move(f), v.wide);
}

std::vector<bool> GraphRun::reusable_inputs(const State& s, const onnx::NodeProto& n) const {
  std::vector<bool> r(size_t(n.input_size()), false);
  for (int k = 0; k < n.input_size(); ++k) {
    const std::string& name = n.input(k);
    const auto v = s.live.find(name);
    const auto left = s.left.find(name);
    if (name.empty() || v == s.live.end() || left == s.left.end() || !v->second.writable || v->second.on_device() ||
        v->second.hold.use_count() != 1)
      continue;
    // the last reader: every read of it that is left is this node's (Mul(x, x) reads it twice)
    r[size_t(k)] = left->second == int(std::count(n.input().begin(), n.input().end(), name));
  }
  return r;
}

std::vector<Value> GraphRun::run_node(const onnx::NodeProto& n, const OpEntry& op, std::vector<const Value*> in,
                                      std::vector<bool> reusable) {
  OpCall call{n, {}, op.float32_on_cpu, &products_, nullptr, &weight_scratch_, std::move(reusable)};
  std::vector<Value> held;  // inputs converted for this node (reserved: pointers into it stay valid)
  held.reserve(2 * in.size());
  if (device_) {
    if (const DeviceOpFn f = find_device_op(n.domain(), n.op_type())) {
      for (const Value* v : in) {
        if (v && v->on_device() && v->wide && !op.float32_on_cpu) {
          Value r = *v;  // ONNX Runtime's inserted Cast, on the device
          r.device = device_->forward_round(v->device, v->dtype);
          r.device.shape = device_shape(v->shape);
          r.wide = false;
          held.push_back(std::move(r));
          v = &held.back();
        }
        call.in.push_back(v);
      }
      std::vector<Value> outs;
      call.device = device_;
      if (f(call, *device_, outs)) return outs;
      call.device = nullptr;
      call.in.clear();
    }
    ++host_ops_[n.op_type()];
  }
  for (const Value* v : in) {
    const bool rounds = v && v->wide && !op.float32_on_cpu && !op.rounds_wide_inputs;
    const bool converted = v && (v->on_device() || rounds);
    if (v && v->on_device()) {
      held.push_back(host_value(*v));
      v = &held.back();
    }
    if (rounds) {
      held.push_back(narrow(*v));
      v = &held.back();
    }
    if (converted && call.in.size() < call.reusable.size()) call.reusable[call.in.size()] = false;  // a copy
    call.in.push_back(v);
  }
  return op.fn(call);
}

void GraphRun::advance(State& s, size_t end, const std::set<std::string>& capture, const Capture& on_capture) {
  const auto& nodes = model_.proto().graph().node();
  for (; s.next < std::min(end, size_t(nodes.size())); ++s.next) {
    const onnx::NodeProto& n = nodes[int(s.next)];
    const OpEntry* op = find_op(n.domain(), n.op_type());
    if (!op) throw Error("forward: node '" + n.name() + "': operator " + n.op_type() + " is not supported by the layer engine");
    const bool on_device = device_ && find_device_op(n.domain(), n.op_type());
    std::vector<const Value*> in;
    std::vector<Value> uploaded;  // initializers' device copies for this node
    uploaded.reserve(size_t(n.input_size()));
    for (const auto& i : n.input()) {
      if (i.empty()) {
        in.push_back(nullptr);
        continue;
      }
      auto it = s.live.find(i);
      const Value* v = it != s.live.end() ? &it->second : initializer(i);
      if (!v) throw Error("forward: node '" + n.name() + "' reads '" + i + "', which nothing produced");
      if (on_device && v->present() && v->is_float() && !v->on_device()) {
        if (it != s.live.end()) {  // an activation goes up once, for every later reader
          it->second = device_value(it->second, i, false);
        } else {
          uploaded.push_back(device_value(*v, i, true));
          v = &uploaded.back();
        }
      }
      in.push_back(v->present() ? v : nullptr);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Value> outs = run_node(n, *op, std::move(in), reusable_inputs(s, n));
    seconds_[n.op_type()] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& i : n.input())
      if (!i.empty() && --s.left[i] == 0) s.live.erase(i);
    for (int k = 0; k < n.output_size(); ++k) {
      const std::string& name = n.output(k);
      if (name.empty() || size_t(k) >= outs.size()) continue;
      if (capture.count(name) && on_capture) on_capture(name, outs[size_t(k)]);
      if (s.left.count(name)) s.live[name] = std::move(outs[size_t(k)]);
    }
  }
}

std::map<std::string, Value> GraphRun::run(const std::map<std::string, Value>& feeds, const std::set<std::string>& keep,
                                           const std::set<std::string>& capture, const Capture& on_capture) {
  std::map<std::string, Value> kept;
  std::set<std::string> wanted = capture;
  wanted.insert(keep.begin(), keep.end());
  const Capture both = [&](const std::string& name, const Value& v) {
    if (capture.count(name) && on_capture) on_capture(name, v);
    if (keep.count(name)) kept[name] = host_value(v);
  };
  State s = start(feeds, wanted, both);
  advance(s, nodes(), wanted, both);
  return kept;
}

}  // namespace nibble::forward

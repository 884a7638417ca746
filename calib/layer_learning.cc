// The layer learner (calib/layer_learning.h).
#include "calib/layer_learning.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <set>

#include "forward/backward.h"
#include "kernels/layer_rounding.h"
#include "loaders/error.h"

namespace nibble {

using forward::Floats;
using forward::GraphRun;
using forward::Value;
namespace lr = kernels::layer_round;

constexpr size_t kGuardBatches = 16;

struct LayerLearner::Batch {
  GraphRun::State fl;  // the float model's activations
  GraphRun::State qu;  // the learned layers' (quantized_inputs)
};

namespace {

// Rows [first, first + count) of a value along its first axis (a copy).
Value rows_of(const Value& v, int64_t first, int64_t count) {
  std::vector<int64_t> shape = v.shape;
  const int64_t per_row = shape[0] ? v.numel() / shape[0] : 0;
  shape[0] = count;
  void* out = nullptr;
  Value r = forward::unfilled_value(v.storage(), shape, &out);
  r.dtype = v.dtype;
  const size_t bytes = size_t(per_row) * dtype_size(v.storage());
  if (count && bytes) std::memcpy(out, static_cast<const uint8_t*>(v.data) + size_t(first) * bytes, size_t(count) * bytes);
  return r;
}

// The batches cut into steps of `samples` samples each (the last may hold fewer): every input's first axis
// is the sample axis.
std::vector<std::map<std::string, Value>> regroup(const std::vector<std::map<std::string, Value>>& feeds, int samples) {
  if (samples <= 0) return feeds;
  std::vector<std::map<std::string, Value>> steps;
  for (const auto& f : feeds) {
    const int64_t n = f.begin()->second.shape.empty() ? 1 : f.begin()->second.shape[0];
    for (const auto& [name, v] : f)
      if (v.shape.empty() || v.shape[0] != n)
        throw Error("layer learning: calibration input '" + name + "' has no sample axis of " + std::to_string(n));
    for (int64_t first = 0; first < n; first += samples) {
      std::map<std::string, Value> m;
      for (const auto& [name, v] : f) m[name] = rows_of(v, first, std::min<int64_t>(samples, n - first));
      steps.push_back(std::move(m));
    }
  }
  return steps;
}

}  // namespace

LayerLearner::LayerLearner(const std::string& model_path, std::vector<std::map<std::string, Value>> feeds,
                           kernels::Backend& backend, LayerLearningOptions o)
    : model_(OnnxModel::load(model_path)), graph_(std::make_unique<GraphRun>(*model_)), backend_(backend), o_(o) {
  if (feeds.empty()) throw Error("layer learning: no calibration batches");
  feeds = regroup(feeds, o_.samples);
  for (auto& f : feeds) {
    Batch b;
    b.fl = graph_->start(f);
    if (o_.quantized_inputs) b.qu = b.fl;
    batches_.push_back(std::move(b));
  }
}

LayerLearner::~LayerLearner() = default;

LayerLearner::Segment LayerLearner::segment_of(const std::vector<std::string>& weights) const {
  Segment seg{graph_->nodes(), 0};
  for (const auto& w : weights) {
    bool read = false;
    for (size_t i = 0; i < graph_->nodes(); ++i) {
      const onnx::NodeProto& n = graph_->node(i);
      if (std::find(n.input().begin(), n.input().end(), w) == n.input().end()) continue;
      if (n.op_type() != "MatMul" || n.input(1) != w)
        throw Error("layer learning: weight '" + w + "' is read by " + n.op_type() + " node '" + n.name() +
                    "' (only a MatMul's second input is learned)");
      read = true;
      seg.first = std::min(seg.first, i);
      seg.end = std::max(seg.end, i + 1);
    }
    if (!read) throw Error("layer learning: no node reads weight '" + w + "'");
  }
  return seg;
}

std::string LayerLearner::cannot_learn(const std::vector<std::string>& weights) {
  try {
    const Segment seg = segment_of(weights);
    return forward::segment_without_vjp(*graph_, seg.first, seg.end, {weights.begin(), weights.end()});
  } catch (const Error& e) {
    return e.what();
  }
}

namespace {

// What the nodes after the segment read of its results: single values, and pairs a residual sum joins.
struct Output {
  std::vector<std::string> singles;
  std::vector<std::pair<std::string, std::string>> pairs;
};

Output output_of(const GraphRun& g, size_t first, size_t end, const GraphRun::State& after) {
  std::set<std::string> made;
  for (size_t i = first; i < end; ++i)
    for (const auto& o : g.node(i).output())
      if (!o.empty() && after.live.count(o) && after.live.at(o).is_float()) made.insert(o);
  Output out;
  if (end < g.nodes()) {
    const onnx::NodeProto& n = g.node(end);
    const bool joins = n.op_type() == "Add" || n.op_type() == "SkipSimplifiedLayerNormalization" ||
                       n.op_type() == "SkipLayerNormalization";
    if (joins && n.input_size() >= 2 && n.input(0) != n.input(1) && made.count(n.input(0)) && made.count(n.input(1))) {
      out.pairs.emplace_back(n.input(0), n.input(1));
      made.erase(n.input(0));
      made.erase(n.input(1));
    }
  }
  out.singles.assign(made.begin(), made.end());
  if (out.singles.empty() && out.pairs.empty()) throw Error("layer learning: the segment's results reach no later node");
  return out;
}

using Targets = std::map<std::string, Floats>;

Targets targets_of(const Output& out, const std::map<std::string, Value>& values) {
  Targets t;
  for (const auto& n : out.singles) t[n] = forward::to_floats(values.at(n));
  for (const auto& [a, b] : out.pairs) {
    Floats s = forward::to_floats(values.at(a));
    const Floats y = forward::to_floats(values.at(b));
    for (size_t i = 0; i < s.size(); ++i) s[i] += y[i];
    t[a + "+" + b] = std::move(s);
  }
  return t;
}

// The objective (mean squared error per output value, summed) and, with `seeds`, its gradient per value.
double objective(const Output& out, const std::map<std::string, Value>& values, const Targets& target,
                 std::map<std::string, Floats>* seeds) {
  double loss = 0.0;
  auto one = [&](const std::string& key, const Floats& y, const std::vector<std::string>& names) {
    const Floats& t = target.at(key);
    double sq = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sq += double(y[i] - t[i]) * double(y[i] - t[i]);
    loss += sq / double(y.size());
    if (!seeds) return;
    Floats d(y.size());
    const float k = 2.0f / float(y.size());
    for (size_t i = 0; i < y.size(); ++i) d[i] = k * (y[i] - t[i]);
    for (const auto& n : names) (*seeds)[n] = d;
  };
  for (const auto& n : out.singles) one(n, forward::to_floats(values.at(n)), {n});
  for (const auto& [a, b] : out.pairs) {
    Floats s = forward::to_floats(values.at(a));
    const Floats y = forward::to_floats(values.at(b));
    for (size_t i = 0; i < s.size(); ++i) s[i] += y[i];
    one(a + "+" + b, s, {a, b});
  }
  return loss;
}

// A weight's learned parameters: on the backend while it learns (its problem uploaded once), then on the
// host (v, f) for the codes.
struct Learned {
  LearnedWeight* w;
  std::vector<float> v, f;
  lr::Weight p;  // over the host arrays
  kernels::LayerRoundProblem problem;
  kernels::LayerRoundParams x;
};

Learned learned_of(LearnedWeight& w, kernels::Backend& backend) {
  using kernels::host_view;
  Learned l{&w, std::vector<float>(w.w.size(), 0.0f), std::vector<float>(w.q.scales.size(), 0.0f), {}, {}, {}};
  lr::Weight& p = l.p;
  p.rows = w.rows, p.cols = w.cols, p.k_axis = w.k_axis;
  p.block = w.spec.block, p.bits = w.spec.bits, p.zero_point = w.spec.zero_point;
  p.scale_dtype = w.scale_dtype;
  p.w = w.w.data();
  p.scale0 = w.q.scales.data();
  p.zp = w.spec.zero_point ? w.q.zero_points.data() : nullptr;
  p.s = w.s.empty() ? nullptr : w.s.data();
  p.divisor = w.divisor.empty() ? nullptr : w.divisor.data();
  p.v = l.v.data();
  p.f = l.f.data();
  kernels::LayerRoundProblem& q = l.problem;
  q.rows = w.rows, q.cols = w.cols, q.k_axis = w.k_axis, q.block = w.spec.block, q.bits = w.spec.bits;
  q.zero_point = w.spec.zero_point, q.scale_dtype = w.scale_dtype;
  const auto up = [&](DType t, int64_t n, const void* data) {
    return n ? backend.upload(host_view(t, {n}, data)) : kernels::Tensor{};
  };
  q.w = backend.upload(host_view(DType::kFloat32, {w.rows, w.cols}, w.w.data()));
  q.scale0 = up(DType::kFloat32, int64_t(w.q.scales.size()), w.q.scales.data());
  if (w.spec.zero_point) q.zero_points = up(DType::kUInt8, int64_t(w.q.zero_points.size()), w.q.zero_points.data());
  q.s = up(DType::kFloat32, int64_t(w.s.size()), w.s.data());
  q.divisor = up(DType::kFloat32, int64_t(w.divisor.size()), w.divisor.data());
  l.x = {host_view(DType::kFloat32, {w.rows, w.cols}, l.v.data()),
         host_view(DType::kFloat32, {int64_t(l.f.size())}, l.f.data())};
  return l;
}

// A float32 tensor's values as Floats (the CPU's host data read in place, a device's downloaded).
Floats floats_of(kernels::Backend& backend, const kernels::Tensor& t) {
  if (t.data) return Floats(t.f32(), t.f32() + t.elements());
  const std::vector<uint8_t> raw = backend.download(t);
  Floats v(raw.size() / sizeof(float));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

// The graph's weight from the current parameters.
Value graph_weight(const Learned& l, kernels::Backend& backend) {
  return forward::from_floats(l.w->dtype, {l.p.rows, l.p.cols},
                              floats_of(backend, backend.layer_round_weight(l.problem, l.x)));
}

// The parameters back on the host, into v and f (what l.p reads).
void to_host(Learned& l, kernels::Backend& backend) {
  const Floats v = floats_of(backend, l.x.v), f = floats_of(backend, l.x.f);
  std::copy(v.begin(), v.end(), l.v.begin());
  std::copy(f.begin(), f.end(), l.f.begin());
}

}  // namespace

LayerLearningStats LayerLearner::learn(std::vector<LearnedWeight>& weights) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> names;
  for (const auto& w : weights) names.push_back(w.name);
  const Segment seg = segment_of(names);
  // Every batch to the segment's first node; its input kept; the float model's output through it the target.
  std::vector<GraphRun::State> input;
  std::vector<Targets> target;
  Output out;
  for (Batch& b : batches_) {
    graph_->advance(b.fl, seg.first, {}, {});
    if (o_.quantized_inputs) graph_->advance(b.qu, seg.first, {}, {});
    input.push_back(o_.quantized_inputs ? b.qu : b.fl);
    graph_->advance(b.fl, seg.end, {}, {});
    if (&b == &batches_.front()) out = output_of(*graph_, seg.first, seg.end, b.fl);
    target.push_back(targets_of(out, b.fl.live));
  }
  std::vector<Learned> learned;
  for (auto& w : weights) learned.push_back(learned_of(w, backend_));
  const auto substitute = [&] {
    for (const Learned& l : learned) graph_->substitute(l.w->name, graph_weight(l, backend_));
  };
  // The objective before and after, over at most kGuardBatches batches spread evenly over them (each
  // pass is a forward of the layer: over all 64 of SmolLM2's samples, a quarter of the learning's time).
  std::vector<size_t> guard;
  for (size_t i = 0; i < std::min(input.size(), kGuardBatches); ++i)
    guard.push_back(i * input.size() / std::min(input.size(), kGuardBatches));
  const auto all_batches = [&] {
    substitute();
    double loss = 0.0;
    for (size_t b : guard) {
      GraphRun::State s = input[b];
      graph_->advance(s, seg.end, {}, {});
      loss += objective(out, s.live, target[b], nullptr);
    }
    return loss / double(guard.size());
  };
  LayerLearningStats st;
  st.weights = int64_t(weights.size());
  st.objective_start = all_batches();
  const std::set<std::string> wrt(names.begin(), names.end());
  std::mt19937 rng{static_cast<uint32_t>(groups_done_)};
  std::vector<size_t> order;
  const double lr0 = o_.lr > 0 ? o_.lr : 1.0 / std::max(1, o_.iters);
  double t_sub = 0, t_fwd = 0, t_bwd = 0, t_step = 0;
  const auto since = [](std::chrono::steady_clock::time_point a) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  };
  for (int t = 0; t < o_.iters; ++t) {
    if (order.empty()) {
      for (size_t b = input.size(); b-- > 0;) order.push_back(b);
      std::shuffle(order.begin(), order.end(), rng);
    }
    const size_t b = order.back();
    order.pop_back();
    auto ta = std::chrono::steady_clock::now();
    substitute();
    t_sub += since(ta);
    ta = std::chrono::steady_clock::now();
    GraphRun::State s = input[b];
    const forward::Tape tape = forward::run_taped(*graph_, s, seg.end);
    std::map<std::string, Floats> seeds;
    objective(out, tape.values, target[b], &seeds);
    t_fwd += since(ta);
    ta = std::chrono::steady_clock::now();
    const std::map<std::string, Floats> grads = forward::backward(*graph_, tape, std::move(seeds), wrt);
    t_bwd += since(ta);
    ta = std::chrono::steady_clock::now();
    const float size = float(lr0 * (1.0 - double(t) / double(o_.iters)));
    for (Learned& l : learned) {
      const Floats& g = grads.at(l.w->name);
      l.x = backend_.layer_round_step(l.problem, l.x, kernels::host_view(DType::kFloat32, {l.p.rows, l.p.cols}, g.data()),
                                      size);
    }
    t_step += since(ta);
  }
  spdlog::debug("layer learning: {} steps: weights {:.2f} s, forward {:.2f} s, backward {:.2f} s, update {:.2f} s",
                o_.iters, t_sub, t_fwd, t_bwd, t_step);
  st.objective_end = o_.iters > 0 ? all_batches() : st.objective_start;
  st.kept_start = !(st.objective_end < st.objective_start);
  for (Learned& l : learned) {
    if (st.kept_start) {  // the start again (zero offsets and factors, on the host)
      l.x = {kernels::host_view(DType::kFloat32, {l.p.rows, l.p.cols}, l.v.data()),
             kernels::host_view(DType::kFloat32, {int64_t(l.f.size())}, l.f.data())};
    } else {
      to_host(l, backend_);
    }
  }
  if (o_.quantized_inputs) {  // the learned layer's outputs: the next layer's inputs (before q's scales move)
    substitute();
    for (Batch& b : batches_) graph_->advance(b.qu, seg.end, {}, {});
  }
  for (Learned& l : learned) {
    LearnedWeight& w = *l.w;
    if (st.kept_start) continue;  // the starting codes and scales as they were given
    std::vector<float> scales(w.q.scales.size());
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = lr::scale_of(l.p, int64_t(i));
    double sq = 0.0;
    for (int64_t n = 0; n < l.p.N(); ++n)
      for (int64_t k = 0; k < l.p.K(); ++k) {
        const size_t i = size_t(l.p.index(k, n));
        const uint8_t c = lr::code_of(l.p, k, n, lr::block_of(l.p, l.p.param(k, n)));
        st.codes_moved += c != w.q.codes[i];
        w.q.codes[i] = c;
        const int64_t pi = l.p.param(k, n);
        const float level = w.spec.zero_point ? float(c) : float(int8_t(c));
        const double d = double(w.w[i]) - double((level - l.p.zero(pi)) * scales[size_t(pi)]);
        sq += d * d;
      }
    w.q.scales = std::move(scales);  // l.p reads the old ones no longer
    w.q.sq_error = sq;
    w.q.packed.clear();
  }
  for (const auto& n : names) graph_->unsubstitute(n);  // no stream reads this group's weights again
  graph_->release_weights();
  ++groups_done_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace nibble

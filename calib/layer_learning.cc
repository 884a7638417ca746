// The layer learner (calib/layer_learning.h).
#include "calib/layer_learning.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
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
    float_.push_back(graph_->start(f));
    learned_.push_back(float_.back());
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

// One output's target on a batch: the float layer's values, and each token row's weight in the objective.
struct Target {
  Floats y;
  std::vector<float> row_weight;  // one per row of the last axis
  size_t row = 1;                 // the last axis
};
using Targets = std::map<std::string, Target>;

}  // namespace

// Why weigh: on Qwen2.5-Coder-1.5B a few tokens' rows carry values thousands of times the others' (massive
// activations) and ruled the plain sum; the steps then raised layer 1's objective ninefold. Weighed, it fell.
std::vector<float> token_row_weights(const float* t, size_t n, size_t row, bool weigh) {
  const size_t rows = n / row;
  std::vector<float> w(rows, 1.0f);
  if (!weigh || rows == 0) return w;
  std::vector<double> ms(rows);
  for (size_t r = 0; r < rows; ++r) {
    double a = 0;
    for (size_t j = 0; j < row; ++j) a += double(t[r * row + j]) * t[r * row + j];
    ms[r] = a / double(row);
  }
  std::vector<double> sorted = ms;
  std::nth_element(sorted.begin(), sorted.begin() + ptrdiff_t(rows / 2), sorted.end());
  const double median = sorted[rows / 2];
  for (size_t r = 0; r < rows; ++r) w[r] = ms[r] > median ? float(median / ms[r]) : 1.0f;
  return w;
}

namespace {

size_t last_axis(const Value& v) { return v.shape.empty() || v.shape.back() <= 0 ? 1 : size_t(v.shape.back()); }

Targets targets_of(const Output& out, const std::map<std::string, Value>& values, bool weigh) {
  Targets t;
  const auto one = [&](const std::string& key, Floats y, size_t row) {
    std::vector<float> w = token_row_weights(y.data(), y.size(), row, weigh);
    t[key] = Target{std::move(y), std::move(w), row};
  };
  for (const auto& n : out.singles) one(n, forward::to_floats(values.at(n)), last_axis(values.at(n)));
  for (const auto& [a, b] : out.pairs) {
    Floats s = forward::to_floats(values.at(a));
    const Floats y = forward::to_floats(values.at(b));
    for (size_t i = 0; i < s.size(); ++i) s[i] += y[i];
    one(a + "+" + b, std::move(s), last_axis(values.at(a)));
  }
  return t;
}

// The objective (the mean over output values of the squared error, each token row's weighted; summed over the
// outputs) and, with `seeds`, its gradient per value.
double objective(const Output& out, const std::map<std::string, Value>& values, const Targets& target,
                 std::map<std::string, Floats>* seeds) {
  double loss = 0.0;
  auto one = [&](const std::string& key, const Floats& y, const std::vector<std::string>& names) {
    const Target& t = target.at(key);
    double sq = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double e = double(y[i] - t.y[i]);
      sq += double(t.row_weight[i / t.row]) * e * e;
    }
    loss += sq / double(y.size());
    if (!seeds) return;
    Floats d(y.size());
    const float k = 2.0f / float(y.size());
    for (size_t i = 0; i < y.size(); ++i) d[i] = k * t.row_weight[i / t.row] * (y[i] - t.y[i]);
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
  const std::vector<float>& base = w.base.empty() ? w.w : w.base;
  p.w = base.data();
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
  q.w = backend.upload(host_view(DType::kFloat32, {w.rows, w.cols}, base.data()));
  q.scale0 = up(DType::kFloat32, int64_t(w.q.scales.size()), w.q.scales.data());
  if (w.spec.zero_point) q.zero_points = up(DType::kUInt8, int64_t(w.q.zero_points.size()), w.q.zero_points.data());
  q.s = up(DType::kFloat32, int64_t(w.s.size()), w.s.data());
  q.divisor = up(DType::kFloat32, int64_t(w.divisor.size()), w.divisor.data());
  l.x = {host_view(DType::kFloat32, {w.rows, w.cols}, l.v.data()),
         host_view(DType::kFloat32, {int64_t(l.f.size())}, l.f.data()), {}};
  return l;
}

}  // namespace

int64_t set_rounding_base(LearnedWeight& w) {
  // Within this much of its code's level: the rounding boundary is 0.5 away, and the margin holds the
  // division's rounding error many times over.
  constexpr float kMargin = 0.49f;
  std::vector<float> none_f(w.q.scales.size(), 0.0f);
  lr::Weight p;
  p.rows = w.rows, p.cols = w.cols, p.k_axis = w.k_axis;
  p.block = w.spec.block, p.bits = w.spec.bits, p.zero_point = w.spec.zero_point;
  p.scale_dtype = w.scale_dtype;
  p.scale0 = w.q.scales.data();
  p.zp = w.spec.zero_point ? w.q.zero_points.data() : nullptr;
  p.f = none_f.data();
  w.base.assign(w.w.size(), 0.0f);
  int64_t missed = 0;
  for (int64_t n = 0; n < p.N(); ++n)
    for (int64_t k = 0; k < p.K(); ++k) {
      const int64_t i = p.index(k, n), pi = p.param(k, n);
      const lr::Block b = lr::block_of(p, pi);
      const uint8_t code = w.q.codes[size_t(i)];
      const float c = w.spec.zero_point ? float(code) : float(int8_t(code));
      const float d = w.w[size_t(i)] / b.scale + b.zero - c;  // how far the weight lies from its code's level
      const bool beyond = (c == p.highest() && d > 0.0f) || (c == p.lowest() && d < 0.0f);  // clamped there anyway
      float x = w.w[size_t(i)];
      if (!beyond && std::fabs(d) > kMargin) x = (c - b.zero + (d < 0.0f ? -kMargin : kMargin)) * b.scale;
      const auto rounds_to = [&](float y) {
        const float l = kernels::hd::rint(y / b.scale + b.zero);
        return (l < p.lowest() ? p.lowest() : (l > p.highest() ? p.highest() : l)) == c;
      };
      if (!rounds_to(x)) x = (c - b.zero) * b.scale;
      missed += !rounds_to(x);
      w.base[size_t(i)] = x;
    }
  return missed;
}

namespace {

// A float32 tensor's values as Floats (the CPU's host data read in place, a device's downloaded).
Floats floats_of(kernels::Backend& backend, const kernels::Tensor& t) {
  if (t.data) return Floats(t.f32(), t.f32() + t.elements());
  const std::vector<uint8_t> raw = backend.download(t);
  Floats v(raw.size() / sizeof(float));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

// The graph's weight from the current parameters (the one the last step made, else made here).
Value graph_weight(const Learned& l, kernels::Backend& backend) {
  const kernels::Tensor w = l.x.weight.empty() ? backend.layer_round_weight(l.problem, l.x) : l.x.weight;
  return forward::from_floats(l.w->dtype, {l.p.rows, l.p.cols}, floats_of(backend, w));
}

// The parameters back on the host, into v and f (what l.p reads).
void to_host(Learned& l, kernels::Backend& backend) {
  const Floats v = floats_of(backend, l.x.v), f = floats_of(backend, l.x.f);
  std::copy(v.begin(), v.end(), l.v.begin());
  std::copy(f.begin(), f.end(), l.f.begin());
}

}  // namespace

namespace {

// The learned codes and scales into the weight's result; how many codes moved.
int64_t write_back(const Learned& l) {
  LearnedWeight& w = *l.w;
  std::vector<float> scales(w.q.scales.size());
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = lr::scale_of(l.p, int64_t(i));
  double sq = 0.0;
  int64_t moved = 0;
  for (int64_t n = 0; n < l.p.N(); ++n)
    for (int64_t k = 0; k < l.p.K(); ++k) {
      const size_t i = size_t(l.p.index(k, n));
      const int64_t pi = l.p.param(k, n);
      const uint8_t c = lr::code_of(l.p, k, n, lr::block_of(l.p, pi));
      moved += c != w.q.codes[i];
      w.q.codes[i] = c;
      const float level = w.spec.zero_point ? float(c) : float(int8_t(c));
      const double d = double(w.w[i]) - double((level - l.p.zero(pi)) * scales[size_t(pi)]);
      sq += d * d;
    }
  w.q.scales = std::move(scales);  // l.p reads the old ones no longer
  w.q.sq_error = sq;
  w.q.packed.clear();
  return moved;
}

// One group's learning over the calibration batches: every batch's learned stream at the segment's first
// node is the layer's input, the float model's output of the segment the target.
class GroupLearning {
 public:
  GroupLearning(GraphRun& g, kernels::Backend& backend, const LayerLearningOptions& o, int group)
      : g_(g), backend_(backend), o_(o), group_(group) {}

  // Both streams to the segment's first node, the float one through it (the targets).
  void prepare(size_t first, size_t end, std::vector<GraphRun::State>& fl, std::vector<GraphRun::State>& qu) {
    end_ = end;
    for (size_t b = 0; b < fl.size(); ++b) {
      g_.advance(fl[b], first, {}, {});
      g_.advance(qu[b], first, {}, {});
      input_.push_back(qu[b]);
      g_.advance(fl[b], end, {}, {});
      if (b == 0) out_ = output_of(g_, first, end, fl[b]);
      target_.push_back(targets_of(out_, fl[b].live, o_.weigh_tokens));
    }
    // At most kGuardBatches spread evenly (each a forward of the layer: over all 64 of SmolLM2's samples, a
    // quarter of the learning's time).
    const size_t n = std::min(input_.size(), kGuardBatches);
    for (size_t i = 0; i < n; ++i) guard_.push_back(i * input_.size() / n);
  }

  void substitute(const std::vector<Learned>& learned) {
    for (const Learned& l : learned) g_.substitute(l.w->name, graph_weight(l, backend_));
  }

  // The objective with the weights substituted, over the guard's batches.
  double guard_objective() {
    double loss = 0.0;
    for (size_t b : guard_) {
      GraphRun::State s = input_[b];
      g_.advance(s, end_, {}, {});
      loss += objective(out_, s.live, target_[b], nullptr);
    }
    return loss / double(guard_.size());
  }

  // Every batch's stream from the segment's input through it, with the weights substituted; the guard's
  // objective over those outputs (the sum guard_objective takes, in its order: the same number).
  double advance_all(std::vector<GraphRun::State>& streams) {
    double loss = 0.0;
    for (size_t b = 0; b < streams.size(); ++b) {
      streams[b] = input_[b];
      g_.advance(streams[b], end_, {}, {});
    }
    for (size_t b : guard_) loss += objective(out_, streams[b].live, target_[b], nullptr);
    return loss / double(guard_.size());
  }

  void run_steps(std::vector<Learned>& learned, const std::set<std::string>& wrt) {
    std::mt19937 rng{static_cast<uint32_t>(group_)};
    std::vector<size_t> order;
    const double lr0 = o_.lr > 0 ? o_.lr : 1.0 / std::max(1, o_.iters);
    double t_sub = 0, t_fwd = 0, t_bwd = 0, t_step = 0;
    auto ta = std::chrono::steady_clock::now();
    const auto lap = [&ta](double& into) {
      const auto now = std::chrono::steady_clock::now();
      into += std::chrono::duration<double>(now - ta).count();
      ta = now;
    };
    for (int t = 0; t < o_.iters; ++t) {
      if (order.empty()) {
        for (size_t b = input_.size(); b-- > 0;) order.push_back(b);
        std::shuffle(order.begin(), order.end(), rng);
      }
      const size_t b = order.back();
      order.pop_back();
      ta = std::chrono::steady_clock::now();
      substitute(learned);
      lap(t_sub);
      GraphRun::State s = input_[b];
      const forward::Tape tape = forward::run_taped(g_, s, end_);
      std::map<std::string, Floats> seeds;
      const double loss = objective(out_, tape.values, target_[b], &seeds);
      spdlog::debug("layer learning: step {}, sample {}: objective {:.5g}", t, b, loss);
      lap(t_fwd);
      const std::map<std::string, Floats> grads = forward::backward(g_, tape, std::move(seeds), wrt);
      lap(t_bwd);
      const float size = float(lr0 * (1.0 - double(t) / double(o_.iters)));
      for (Learned& l : learned) {
        const Floats& g = grads.at(l.w->name);
        l.x = backend_.layer_round_step(l.problem, l.x,
                                        kernels::host_view(DType::kFloat32, {l.p.rows, l.p.cols}, g.data()), size);
      }
      lap(t_step);
    }
    spdlog::debug("layer learning: {} steps: weights {:.2f} s, forward {:.2f} s, backward {:.2f} s, update {:.2f} s",
                  o_.iters, t_sub, t_fwd, t_bwd, t_step);
  }

 private:
  GraphRun& g_;
  kernels::Backend& backend_;
  const LayerLearningOptions& o_;
  int group_;
  size_t end_ = 0;
  std::vector<GraphRun::State> input_;
  std::vector<Targets> target_;
  Output out_;
  std::vector<size_t> guard_;
};

}  // namespace

LayerLearningStats LayerLearner::learn(std::vector<LearnedWeight>& weights) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> names;
  for (const auto& w : weights) names.push_back(w.name);
  const Segment seg = segment_of(names);
  GroupLearning group(*graph_, backend_, o_, groups_done_);
  group.prepare(seg.first, seg.end, float_, learned_);
  std::vector<Learned> learned;
  for (auto& w : weights) learned.push_back(learned_of(w, backend_));
  LayerLearningStats st;
  st.weights = int64_t(weights.size());
  group.substitute(learned);
  st.objective_start = group.guard_objective();
  group.run_steps(learned, {names.begin(), names.end()});
  // The learned layer's outputs are the next layer's inputs (made before q's scales move); the guard reads
  // its batches among them. Where they are no better, the start's outputs replace them.
  if (o_.iters > 0) group.substitute(learned);
  st.objective_end = group.advance_all(learned_);
  st.kept_start = !(st.objective_end < st.objective_start);
  for (Learned& l : learned) {
    if (st.kept_start)  // the start again (zero offsets and factors, on the host)
      l.x = {kernels::host_view(DType::kFloat32, {l.p.rows, l.p.cols}, l.v.data()),
             kernels::host_view(DType::kFloat32, {int64_t(l.f.size())}, l.f.data()), {}};
    else
      to_host(l, backend_);
  }
  if (st.kept_start && o_.iters > 0) {
    group.substitute(learned);
    group.advance_all(learned_);
  }
  if (!st.kept_start)  // else the starting codes and scales as they were given
    for (const Learned& l : learned) st.codes_moved += write_back(l);
  for (const auto& n : names) graph_->unsubstitute(n);  // no stream reads this group's weights again
  graph_->release_weights();
  ++groups_done_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace nibble

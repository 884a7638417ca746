#include "host/algo/layer_learned.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <mutex>

#include "host/algo/arithmetic.h"
#include "kernels/half_float.h"
#include "loaders/error.h"

namespace nibble {
namespace {

std::mutex totals_mutex;
struct Totals {
  double objective_start = 0, objective_end = 0, seconds = 0;
  int64_t codes_moved = 0, weights = 0, layers = 0, kept_start = 0;
  nlohmann::json not_learned = nlohmann::json::array();
} totals;

// The prepared weight's elements as float32 (downloaded where the backend left it).
std::vector<float> host_floats(kernels::Backend& backend, const kernels::WeightMatrix& w) {
  std::vector<uint8_t> bytes;
  const uint8_t* p = static_cast<const uint8_t*>(w.data);
  if (!p) {
    bytes = backend.download(w.tensor());
    p = bytes.data();
  }
  const size_t n = size_t(w.rows * w.cols);
  std::vector<float> out(n);
  switch (w.dtype) {
    case DType::kFloat32: std::memcpy(out.data(), p, n * 4); break;
    case DType::kFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = half_to_float(h);
      }
      break;
    case DType::kBFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      break;
    default: throw Error("awq_learned_layer: a weight of type " + std::string(dtype_name(w.dtype)));
  }
  return out;
}

}  // namespace

LayerLearningOptions layer_learning_options(const QuantizeOptions& o) {
  LayerLearningOptions l;
  l.iters = o.learned_layer_iters;
  l.lr = o.learned_layer_lr;
  l.samples = o.learned_layer_samples;
  l.weigh_tokens = !o.learned_layer_unweighted;
  l.quiet = o.quiet;
  return l;
}

LayerLearnedQuantizer::LayerLearnedQuantizer(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend,
                                             LayerLearner* learner, int group, std::string why)
    : o_(o), calib_(calib), backend_(backend), learner_(learner), group_(group), why_(std::move(why)) {
  if (o.learns_layers_from_gptq())
    gptq_ = std::make_unique<GptqQuantizer>(o, calib, backend, /*learned_rounding=*/o.learned_layer_sweeps);
}

void LayerLearnedQuantizer::begin_group(const std::vector<GroupWeight>& weights) {
  std::vector<LearnedWeight> ws;
  for (const GroupWeight& g : weights) {
    const PlannedWeight& pw = *g.pw;
    LearnedWeight lw;
    lw.name = pw.weight;
    lw.dtype = pw.dtype;
    lw.rows = pw.rows, lw.cols = pw.cols, lw.k_axis = pw.k_axis;
    lw.spec = g.spec;
    lw.scale_dtype = int(kernels::scale_type(g.spec, pw.dtype));
    if (gptq_) {  // awq_gptq's result: the start (siblings share their factor)
      gptq_->quantize(pw, g.w, g.spec, g.awq_scale, lw.q);
      if (g.awq_scale) lw.s = *g.awq_scale;
    } else if (g.awq_scale) {  // awq_lite's own result: the start
      quantize_awq_scaled(o_, pw, g.w, g.spec, *g.awq_scale, calib_, backend_, lw.q);
      lw.s = *g.awq_scale;
    } else {
      backend_.rtn(g.w, g.spec, lw.q);
    }
    if (g.divisor) lw.divisor = *g.divisor;
    if (learner_) lw.w = host_floats(backend_, g.w);
    if (learner_ && gptq_) {
      if (const int64_t missed = set_rounding_base(lw))
        spdlog::warn("{}: {} of its GPTQ codes are not any value's nearest level (a block of scale 0)", lw.name, missed);
    }
    ws.push_back(std::move(lw));
  }
  const std::lock_guard<std::mutex> lock(totals_mutex);
  if (learner_) {
    const LayerLearningStats st = learner_->learn(ws);
    spdlog::info("layer group {}: learned rounding, objective {:.4g} -> {:.4g}{}, {} codes moved, {:.1f} s", group_,
                 st.objective_start, st.objective_end, st.kept_start ? (gptq_ ? " (no lower: awq_gptq's codes kept)" : " (no lower: awq_lite's codes kept)") : "",
                 st.codes_moved, st.seconds);
    totals.objective_start += st.objective_start;
    totals.objective_end += st.kept_start ? st.objective_start : st.objective_end;
    totals.codes_moved += st.codes_moved;
    totals.weights += st.weights;
    totals.layers += 1;
    totals.kept_start += st.kept_start;
    totals.seconds += st.seconds;
  } else {
    totals.not_learned.push_back({{"group", group_}, {"why", why_}});
  }
  for (LearnedWeight& w : ws) results_[w.name] = std::move(w.q);
}

void LayerLearnedQuantizer::quantize(const PlannedWeight& pw, const kernels::WeightMatrix&, const kernels::QuantSpec&,
                                     const std::vector<float>*, kernels::QuantResult& q) {
  auto it = results_.find(pw.weight);
  if (it == results_.end()) throw Error("awq_learned_layer: weight '" + pw.weight + "' was not in its layer group");
  const bool keep = q.keep, pack = q.pack;
  q = std::move(it->second);
  q.keep = keep;
  q.pack = pack;
  results_.erase(it);
}

nlohmann::json layer_learning_summary() {
  const std::lock_guard<std::mutex> lock(totals_mutex);
  return {{"layers", totals.layers},
          {"weights", totals.weights},
          {"objective_start", totals.objective_start},
          {"objective_learned", totals.objective_end},
          {"codes_moved", totals.codes_moved},
          {"layers_kept_start", totals.kept_start},
          {"not_learned", totals.not_learned},
          {"seconds", totals.seconds}};
}

}  // namespace nibble

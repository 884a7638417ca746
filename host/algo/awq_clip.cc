#include "host/algo/awq_clip.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include <cmath>

#include "host/algo/mixed_precision.h"
#include "loaders/error.h"

namespace nibble {

std::vector<double> modelopt_clip_ratios(double step, double alpha_min) {
  std::vector<double> out;
  if (step > 0) {
    // np.arange(start, stop, step): ceil((stop - start) / step) values start + i * step.
    const double n = std::ceil((1.0 - alpha_min) / step);
    for (int64_t i = 0; i < int64_t(n); ++i) {
      const double v = alpha_min + double(i) * step;
      out.push_back(std::nearbyint(v * 100.0) / 100.0);  // Python's round(v, 2)
    }
  }
  out.push_back(1.0);
  return out;
}


void awq_full_modelopt_scales(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                              kernels::Backend& backend, std::map<std::string, AwqChoice>* per_node,
                              std::map<std::string, AwqChoice>* final_scales) {
  // awq_lite_search without sibling averaging gives each node's own s*; the final scales are then
  // averaged over siblings as awq_lite_search does with fuse on.
  QuantizeOptions no_fuse = o;
  no_fuse.awqlite_disable_fuse_nodes = true;
  *per_node = awq_lite_search(model, plan, calib, no_fuse, /*modelopt=*/true, backend);
  *final_scales = *per_node;
  if (o.awqlite_disable_fuse_nodes || o.awqlite_run_per_subgraph) return;
  average_sibling_scales_modelopt(plan, backend, final_scales);
}

Calibration::Extras clip_calibration(const QuantizeOptions& o, const Plan& plan) {
  Calibration::Extras e;
  if (!o.searches_clip()) return e;
  if (o.modelopt()) e.sample_tokens = kClipMaxTokens;
  // awq_full's scale search needs the whole Gram matrix; so do nibble mode with a per-channel block
  // (B = K) and the sensitivity measure of mixed precision. Otherwise ModelOpt's awq_clip reads no
  // Gram at all, and the small block-diagonal saves the memory.
  if (o.algo != Algo::kAwqClip || o.block_size <= 0 || mixed_needs_calibration(o)) return e;
  for (const auto& pw : plan.weights)
    if (pw.resolved_block() != o.block_size) return e;
  e.gram_block = o.block_size;
  return e;
}

ClipSearch::ClipSearch(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend)
    : o_(o), calib_(calib), backend_(backend), modelopt_(o.modelopt()) {
  if (modelopt_ && o.use_zero_point && o.algo == Algo::kAwqClip)
    spdlog::warn("--use_zero_point: ModelOpt's awq_clip ignores it (modelopt mode writes symmetric INT4)");
}

void ClipSearch::search_modelopt(OnnxModel& model, const Plan& plan, const std::map<std::string, AwqChoice>* per_node) {
  const std::vector<double> ratios = modelopt_clip_ratios(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  size_t done = 0;
  for (const auto& pw : plan.weights) {
    TensorView v = model.view(*model.initializer(pw.weight));
    kernels::WeightMatrix w{pw.dtype, v.data, pw.rows, pw.cols, pw.k_axis, {}};
    std::vector<uint8_t> scaled;
    if (per_node) {  // awq_full: W ⊙ s* of this node's own search, rounded to the weight dtype
      scaled = backend_.scale_weight(w, per_node->at(pw.weight).scale.data());
      w.data = scaled.data();
    }
    kernels::QuantSpec spec;
    spec.bits = pw.bits;
    spec.block = pw.resolved_block();
    int64_t T = 0;
    const float* x = calib_.token_sample(pw.activation, pw.K(), &T);
    ratios_[pw.weight] = backend_.clip_search_modelopt(w, spec, x, T, ratios, o_.awqclip_bsz_col);
    model.release(v);
    const auto& r = ratios_[pw.weight];
    const auto clipped = std::count_if(r.begin(), r.end(), [](float a) { return a != 1.0f; });
    spdlog::info("clip [{}/{}] {}: {} tokens, {} of {} blocks clipped", ++done, plan.weights.size(), pw.weight, T,
                 clipped, r.size());
  }
}

void ClipSearch::quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                          const std::vector<float>* awq_scale, kernels::QuantResult& q) {
  if (modelopt_) {
    if (spec.zero_point) {  // ModelOpt's find_scales ignores alpha with a zero point
      backend_.rtn(w, spec, q);
      return;
    }
    backend_.rtn_ratios(w, spec, ratios_.at(pw.weight).data(), q);
    return;
  }
  // The Gram matrix (or its block-diagonal) as calibration kept it, its pages dropped after each
  // weight: the calibration state resident at a time is one activation's.
  int64_t block = 0;
  const double* gram = calib_.gram_as_kept(pw.activation, pw.K(), &block);
  if (block && block != spec.block)
    throw Error("calibration of '" + pw.activation + "' kept Gram blocks of " + std::to_string(block) +
                ", the weight's block is " + std::to_string(spec.block));
  std::vector<float> inv;
  if (awq_scale) {
    inv.resize(awq_scale->size());
    for (size_t k = 0; k < inv.size(); ++k) inv[k] = 1.0f / (*awq_scale)[k];
  }
  kernels::GramClipOptions opt;
  const auto grid = modelopt_clip_ratios(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  for (auto it = grid.rbegin(); it != grid.rend(); ++it) opt.ratios.push_back(float(*it));  // 1.0 first
  opt.both_signs = true;  // measured: ppl 69.50 with, 71.28 without (bench/RESULTS.md)
  if (block && pw.activation != blocks_of_) {
    kept_blocks_.reset();  // the last activation's, freed first
    kept_blocks_ = backend_.keep_gram_blocks(gram, pw.K(), block);
    blocks_of_ = pw.activation;
  }
  if (block) opt.kept_blocks = kept_blocks_;
  backend_.clip_quantize_gram(w, spec, gram, block, awq_scale ? inv.data() : nullptr, opt, q);
  calib_.release_gram(pw.activation);
}

}  // namespace nibble

#include "host/awq_clip.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/clip_ref.h"
#include "kernels/cpu/rtn_fast.h"
#include "host/mixed_precision.h"
#include "loaders/error.h"

namespace nibble {

void awq_full_modelopt_scales(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                              std::map<std::string, AwqChoice>* per_node, std::map<std::string, AwqChoice>* final_scales) {
  // awq_lite_search without sibling averaging gives each node's own s*; the final scales are then
  // averaged over siblings as awq_lite_search does with fuse on.
  QuantizeOptions no_fuse = o;
  no_fuse.awqlite_disable_fuse_nodes = true;
  *per_node = awq_lite_search(model, plan, calib, no_fuse, /*modelopt=*/true);
  *final_scales = *per_node;
  if (o.awqlite_disable_fuse_nodes || o.awqlite_run_per_subgraph) return;
  average_sibling_scales_modelopt(plan, final_scales);
}

Calibration::Extras clip_calibration(const QuantizeOptions& o, const Plan& plan) {
  Calibration::Extras e;
  if (o.algo != "awq_clip" && o.algo != "awq_full") return e;
  if (o.awq_mode == "modelopt") e.sample_tokens = kClipMaxTokens;
  // awq_full's scale search needs the whole Gram matrix; so do nibble mode with a per-channel block
  // (B = K) and the sensitivity measure of mixed precision. Otherwise ModelOpt's awq_clip reads no
  // Gram at all, and the small block-diagonal saves the memory.
  if (o.algo != "awq_clip" || o.block_size <= 0 || mixed_needs_calibration(o)) return e;
  for (const auto& pw : plan.weights)
    if (pw.resolved_block() != o.block_size) return e;
  e.gram_block = o.block_size;
  return e;
}

ClipSearch::ClipSearch(const QuantizeOptions& o, Calibration& calib, bool modelopt)
    : o_(o), calib_(calib), modelopt_(modelopt) {
  if (modelopt_ && o.use_zero_point && o.algo == "awq_clip")
    spdlog::warn("--use_zero_point: ModelOpt's awq_clip ignores it (modelopt mode writes symmetric INT4)");
}

void ClipSearch::search_modelopt(OnnxModel& model, const Plan& plan, const std::map<std::string, AwqChoice>* per_node) {
  const std::vector<double> ratios = kernels::modelopt_clip_ratios(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  size_t done = 0;
  for (const auto& pw : plan.weights) {
    TensorView v = model.view(*model.initializer(pw.weight));
    kernels::WeightMatrix w{pw.dtype, v.data, pw.rows, pw.cols, pw.k_axis};
    std::vector<uint8_t> scaled;
    if (per_node) {  // awq_full: W ⊙ s* of this node's own search, rounded to the weight dtype
      scaled = kernels::scale_weight(w, per_node->at(pw.weight).scale.data());
      w.data = scaled.data();
    }
    kernels::QuantSpec spec;
    spec.bits = pw.bits;
    spec.block = pw.resolved_block();
    int64_t T = 0;
    const float* x = calib_.token_sample(pw.activation, pw.K(), &T);
    ratios_[pw.weight] = kernels::clip_search_modelopt(w, spec, x, T, ratios, o_.awqclip_bsz_col);
    model.release(v);
    const auto& r = ratios_[pw.weight];
    const auto clipped = std::count_if(r.begin(), r.end(), [](float a) { return a != 1.0f; });
    spdlog::info("clip [{}/{}] {}: {} tokens, {} of {} blocks clipped", ++done, plan.weights.size(), pw.weight, T,
                 clipped, r.size());
  }
}

const std::vector<float>* ClipSearch::ratios(const std::string& weight) const {
  auto it = ratios_.find(weight);
  return it == ratios_.end() ? nullptr : &it->second;
}

void ClipSearch::quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                          const std::vector<float>* awq_scale, kernels::QuantResult& q) {
  if (modelopt_) {
    if (spec.zero_point) {  // ModelOpt's find_scales ignores alpha with a zero point
      kernels::rtn_quantize_fast(w, spec, q);
      return;
    }
    kernels::rtn_quantize_ratios(w, spec, ratios_.at(pw.weight).data(), q);
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
  const auto grid = kernels::modelopt_clip_ratios(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  for (auto it = grid.rbegin(); it != grid.rend(); ++it) opt.ratios.push_back(float(*it));  // 1.0 first
  opt.both_signs = true;  // measured: ppl 69.50 with, 71.28 without (bench/RESULTS.md)
  kernels::clip_quantize_gram(w, spec, gram, block, awq_scale ? inv.data() : nullptr, opt, q);
  calib_.release_gram(pw.activation);
}

}  // namespace nibble

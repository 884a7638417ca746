#include "host/algo/awq_clip.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include <cmath>

#include "host/algo/mixed_precision.h"
#include "loaders/error.h"

namespace nibble {

std::vector<double> clip_ratio_grid(double step, double alpha_min) {
  std::vector<double> out;
  for (double v : numpy_arange(alpha_min, 1.0, step)) out.push_back(std::nearbyint(v * 100.0) / 100.0);  // round(v, 2)
  out.push_back(1.0);
  return out;
}

Calibration::Extras clip_calibration(const QuantizeOptions& o, const Plan& plan) {
  Calibration::Extras e;
  if (!o.searches_clip()) return e;
  // A scale search beside the clip search (awq_full) needs the whole Gram matrix; so do nibble mode with a
  // per-channel block (B = K) and the sensitivity measure of mixed precision. Otherwise ModelOpt's awq_clip
  // reads no Gram at all, and the small block-diagonal saves the memory.
  if (o.searches_scales() || o.block_size <= 0 || mixed_needs_calibration(o)) return e;
  for (const auto& pw : plan.weights)
    if (pw.resolved_block() != o.block_size) return e;
  e.gram_block = o.block_size;
  return e;
}

GramClipSearch::GramClipSearch(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend)
    : o_(o), calib_(calib), backend_(backend) {}

void GramClipSearch::quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                              const std::vector<float>* awq_scale, kernels::QuantResult& q) {
  // The Gram matrix (or its block-diagonal) as calibration kept it (the layer engine's: on the backend, read
  // there), a file's pages dropped after each weight: the calibration state resident at a time is one
  // activation's.
  int64_t block = 0;
  kernels::Tensor g = calib_.gram_tensor(pw.activation, pw.K(), &block);
  if (block && block != spec.block)
    throw Error("calibration of '" + pw.activation + "' kept Gram blocks of " + std::to_string(block) +
                ", the weight's block is " + std::to_string(spec.block));
  std::vector<float> inv;
  if (awq_scale) {
    inv.resize(awq_scale->size());
    for (size_t k = 0; k < inv.size(); ++k) inv[k] = 1.0f / (*awq_scale)[k];
  }
  kernels::GramClipOptions opt;
  const auto grid = clip_ratio_grid(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  for (auto it = grid.rbegin(); it != grid.rend(); ++it) opt.ratios.push_back(float(*it));  // 1.0 first
  opt.both_signs = true;  // measured: ppl 69.50 with, 71.28 without (bench/RESULTS.md)
  if (block) {  // the blocks go on the backend once for the sibling weights that read this activation
    if (pw.activation != blocks_of_) {
      blocks_.release();  // the last activation's, freed first
      blocks_ = backend_.upload(g);
      blocks_of_ = pw.activation;
    }
    g.buffer = blocks_.buffer;
  }
  backend_.clip_quantize_gram(w, spec, g, block, awq_scale ? inv.data() : nullptr, opt, q);
  calib_.release_gram(pw.activation);
}

}  // namespace nibble

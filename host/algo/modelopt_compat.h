// ModelOpt compatibility (--awq_mode modelopt): NVIDIA ModelOpt 0.47's ONNX INT4 arithmetic, its quirks
// included, so that on fp32 models nibble writes ModelOpt's INT4 codes exactly — the oracle that the
// algorithms are implemented right. Every deliberate quirk lives here, each named in one comment;
// docs/modelopt-compat.md lists them beside nibble's own choice. host/algo/arithmetic.cc is the one
// place that calls these instead of nibble's algorithms.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "host/algo/kept_weights.h"
#include "host/algo/awq.h"
#include "host/algo/awq_clip.h"
#include "host/graph/plan.h"
#include "host/options.h"
#include "kernels/backend.h"
#include "loaders/onnx_model.h"

namespace nibble::modelopt {

// Quirk: padding tokens are counted in every activation statistic (the attention mask is not applied).
constexpr bool kMasksPadding = false;

// Quirk: rtn/rtn_dq round to nearest on the symmetric 15-level grid, scale amax / 7 (no scale search).
constexpr bool kRtnSearchesScale = false;

// AWQ-lite. Quirks: per-node search on the fixed grid 0, 0.1, ..., 1 (--awqlite_alpha_step ignored),
// weight statistic over ModelOpt's strided blocks, x_mean and the scale formula in numpy's own float32
// arithmetic; with fuse on (the default) siblings then get the mean of their scales. With
// --awqlite_run_per_subgraph: one search per activation over all its MatMuls on --awqlite_alpha_step's
// grid, with its own joint weight statistic.
// kept: where a device backend holds each weight from the search to the quantizer (null: not held).
std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& o, kernels::Backend& backend,
                                                 KeptWeights* kept = nullptr);

// Quirk: with fuse on, siblings (MatMuls sharing an input) all get the mean of their own scales.
void average_sibling_scales(const Plan& plan, kernels::Backend& backend, std::map<std::string, AwqChoice>* choices);

// awq_full's scales. Quirk: each node's own s* (per_node) is what the clip search later sees; the
// final scales are the siblings' mean with fuse on, as awq_lite_search gives them.
void awq_full_scales(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                     kernels::Backend& backend, std::map<std::string, AwqChoice>* per_node,
                     std::map<std::string, AwqChoice>* final_scales);

// Quirk: ModelOpt's max_tokens (int4.py _clip_search): the clip search reads a sample of 64 token rows
// (rows 0, step, 2·step, ... of the concatenated calibration activations, step = T // 64, padding
// included), which calibration is asked to keep.
constexpr int64_t kClipMaxTokens = 64;
void ask_token_sample(Calibration::Extras* extras);

// awq_clip / awq_full's clip search. Quirks: every weight searched before any is quantized, on the token
// sample, float32 per-block partial products in --awqclip_bsz_col column chunks, the first strictly
// smaller loss wins; awq_full searches W ⊙ s* (the node's own s*) against the UNSCALED X and then
// quantizes W ⊙ s (the siblings' mean). The final weight is quantized symmetric with those ratios:
// with a zero point (awq_full) the ratios have no effect.
class TokenSampleClipSearch : public ClipSearch {
 public:
  TokenSampleClipSearch(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend);
  // Searches every weight of the plan now (on W ⊙ s* with per_node, else on W).
  void search(OnnxModel& model, const Plan& plan, const std::map<std::string, AwqChoice>* per_node);
  void quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                const std::vector<float>* awq_scale, kernels::QuantResult& q) override;

 private:
  const QuantizeOptions& o_;
  Calibration& calib_;
  kernels::Backend& backend_;
  std::map<std::string, std::vector<float>> ratios_;
};

// Quirk: W ⊙ s is rounded to the weight's dtype (numpy's arithmetic) before it is quantized (on a device
// backend it stays there for the quantizer).
kernels::WeightMatrix scale_weight(kernels::Backend& backend, const kernels::WeightMatrix& w, const float* s);

// Quirk: an AWQ-scaled weight (awq_lite) is rounded to nearest, no clip; the sensitivity measure of
// mixed precision measures that quantizer too (no clip ratios).
void quantize_awq_scaled(kernels::Backend& backend, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                         kernels::QuantResult& q);

// Quirk: awq_clip writes symmetric INT4 whatever --use_zero_point says.
bool writes_zero_point(const QuantizeOptions& o);

// Quirk: an embedding table (Gather) is rounded to nearest, symmetric unless awq_lite with a zero point.
bool gather_zero_point(const QuantizeOptions& o);
void quantize_gather(kernels::Backend& backend, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                     kernels::QuantResult& q);

// What ModelOpt has no arithmetic for (the method record's refusal: RTN search, HQQ, GPTQ) or refuses
// (per-subgraph search with awq_full or mixed precision): one-line errors.
void check_supported(const QuantizeOptions& o);
// Flags ModelOpt's arithmetic ignores here (the per-node grid's alpha step, awq_clip's zero point).
void warn_inert_flags(const QuantizeOptions& o);

}  // namespace nibble::modelopt

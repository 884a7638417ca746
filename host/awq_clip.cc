#include "host/awq_clip.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/clip_ref.h"
#include "kernels/cpu/rtn_fast.h"
#include "host/mixed_precision.h"
#include "loaders/error.h"

namespace nibble {

void awq_full_modelopt_scales(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                              std::map<std::string, AwqChoice>* per_node, std::map<std::string, AwqChoice>* final_scales) {
  // awq_lite_search without sibling averaging gives each node's own s*; the averaging is then
  // ModelOpt's (as awq_lite_search does it): numpy's mean over axis 1 of [K, m], m < 8 siblings.
  QuantizeOptions no_fuse = o;
  no_fuse.awqlite_disable_fuse_nodes = true;
  *per_node = awq_lite_search(model, plan, calib, no_fuse, /*modelopt=*/true);
  *final_scales = *per_node;
  if (o.awqlite_disable_fuse_nodes || o.awqlite_run_per_subgraph) return;
  for (const auto& [act, idx] : plan.siblings) {
    if (idx.size() < 2) continue;
    const int64_t K = plan.weights[idx[0]].K();
    std::vector<float> mean(static_cast<size_t>(K));
    std::vector<float> col(idx.size());
    for (int64_t k = 0; k < K; ++k) {
      for (size_t j = 0; j < idx.size(); ++j) col[j] = per_node->at(plan.weights[idx[j]].weight).scale[size_t(k)];
      mean[size_t(k)] = kernels::numpy_sum_f32(col.data(), int64_t(col.size())) / float(col.size());
    }
    for (size_t i : idx) (*final_scales)[plan.weights[i].weight].scale = mean;
  }
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
  namespace fs = std::filesystem;
  const fs::path idx = fs::path(calib.folder()) / "index.json";
  nlohmann::json index;
  try {
    std::ifstream f(idx);
    index = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error("cannot read " + idx.string() + ": " + e.what());
  }
  for (const auto& a : index.at("activations")) {
    Gram gr;
    gr.K = a.at("K").get<int64_t>();
    gr.block = a.value("gram_block", int64_t(0));
    gr.file = (fs::path(calib.folder()) / a.at("gram").get<std::string>()).string();
    grams_[a.at("name").get<std::string>()] = gr;
    if (!a.contains("token_sample")) continue;
    Sample s;
    s.rows = a.at("token_sample_rows").get<int64_t>();
    s.K = a.at("K").get<int64_t>();
    s.file = (fs::path(calib.folder()) / a.at("token_sample").get<std::string>()).string();
    samples_[a.at("name").get<std::string>()] = s;
  }
}

ClipSearch::~ClipSearch() = default;

const float* ClipSearch::sample_rows(const std::string& activation, int64_t K, int64_t* rows) {
  auto it = samples_.find(activation);
  if (it == samples_.end())
    throw Error("calibration kept no token sample of activation '" + activation + "' (awq_clip, modelopt mode)");
  const Sample& s = it->second;
  if (s.K != K) throw Error("token sample of '" + activation + "' has K " + std::to_string(s.K));
  *rows = s.rows;
  if (s.rows == 0) return nullptr;
  const MappedFile& m = map(s.file);
  if (m.size() != uint64_t(s.rows * s.K) * 4)
    throw Error("calibration file " + s.file + " has " + std::to_string(m.size()) + " bytes, expected " +
                std::to_string(s.rows * s.K * 4));
  return reinterpret_cast<const float*>(m.data());
}

const MappedFile& ClipSearch::map(const std::string& file) {
  auto m = maps_.find(file);
  if (m == maps_.end()) m = maps_.emplace(file, std::make_unique<MappedFile>(file)).first;
  return *m->second;
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
    const float* x = sample_rows(pw.activation, pw.K(), &T);
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
  // The Gram matrix (or its block-diagonal) is read here from its own map, and its pages dropped
  // after each weight: the calibration state resident at a time is one activation's.
  auto gi = grams_.find(pw.activation);
  if (gi == grams_.end()) throw Error("calibration did not measure activation '" + pw.activation + "'");
  const Gram& gr = gi->second;
  if (gr.K != pw.K()) throw Error("calibration of '" + pw.activation + "' has K " + std::to_string(gr.K));
  if (gr.block && gr.block != spec.block)
    throw Error("calibration of '" + pw.activation + "' kept Gram blocks of " + std::to_string(gr.block) +
                ", the weight's block is " + std::to_string(spec.block));
  const MappedFile& gm = map(gr.file);
  const uint64_t want = gr.block ? uint64_t(kernels::num_blocks(gr.K, gr.block) * gr.block * gr.block) * 8
                                 : uint64_t(gr.K * gr.K) * 8;
  if (gm.size() != want)
    throw Error("calibration file " + gr.file + " has " + std::to_string(gm.size()) + " bytes, expected " +
                std::to_string(want));
  std::vector<float> inv;
  if (awq_scale) {
    inv.resize(awq_scale->size());
    for (size_t k = 0; k < inv.size(); ++k) inv[k] = 1.0f / (*awq_scale)[k];
  }
  kernels::GramClipOptions opt;
  const auto grid = kernels::modelopt_clip_ratios(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  for (auto it = grid.rbegin(); it != grid.rend(); ++it) opt.ratios.push_back(float(*it));  // 1.0 first
  opt.both_signs = true;  // measured: ppl 69.50 with, 71.28 without (bench/RESULTS.md)
  kernels::clip_quantize_gram(w, spec, reinterpret_cast<const double*>(gm.data()), gr.block,
                              awq_scale ? inv.data() : nullptr, opt, q);
  gm.release(0, gm.size());
}

}  // namespace nibble

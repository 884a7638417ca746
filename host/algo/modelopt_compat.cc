#include "host/algo/modelopt_compat.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "host/algo/awq_parts.h"
#include "host/algo/mixed_precision.h"
#include "host/methods.h"
#include "loaders/error.h"

namespace nibble::modelopt {

using namespace awq_parts;

// ---- AWQ-lite

void average_sibling_scales(const Plan& plan, kernels::Backend& backend, std::map<std::string, AwqChoice>* choices) {
  for (const auto& [act, idx] : plan.siblings) {
    if (idx.size() < 2) continue;
    std::vector<const std::vector<float>*> scales;
    for (size_t i : idx) scales.push_back(&choices->at(plan.weights[i].weight).scale);
    const std::vector<float> mean = backend.mean_of(scales);
    for (size_t i : idx) (*choices)[plan.weights[i].weight].scale = mean;
  }
}

namespace {

// The weight of `pw`, held by `kept` on a device backend when given (read by both passes of the search
// and then by the quantizer: one upload), else the host view.
Loaded load_held(OnnxModel& model, const PlannedWeight& pw, kernels::Backend& backend, KeptWeights* kept) {
  Loaded l = load(model, pw);
  if (kept) l.w = keep_weight(backend, kept, pw, l.view.data);
  return l;
}

// One search per node on the fixed grid 0, 0.1, ..., 1, with numpy's own scale arithmetic.
std::map<std::string, AwqChoice> search_per_node(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& o, kernels::Backend& backend,
                                                 KeptWeights* kept) {
  std::map<std::string, AwqChoice> out;
  GramCache grams(backend, /*cholesky=*/false);
  const size_t total = plan.weights.size();
  const std::vector<double> alphas = awq_alphas(0.1);
  std::vector<Calibration::GridItem> items;
  for (size_t i = 0; i < total; ++i) {
    const auto& pw = plan.weights[i];
    Loaded l = load_held(model, pw, backend, kept);
    const ActivationStats st = calib.stats(pw.activation, true);
    Calibration::GridItem it;
    it.id = "w" + std::to_string(i);
    it.x_mean.assign(st.x_mean, st.x_mean + st.K);
    it.w_mean = backend.awq_weight_mean(l.w, pw.resolved_block(), false);
    items.push_back(std::move(it));
    model.release(l.view);
  }
  auto grid = calib.numpy_grid(items, alphas);
  for (size_t i = 0; i < total; ++i) {
    const auto& pw = plan.weights[i];
    Loaded l = load_held(model, pw, backend, kept);
    ActivationStats st;
    const kernels::GramForm g = grams.get(calib, pw.activation, true, &st);
    const auto& scales = grid.at("w" + std::to_string(i));
    AwqChoice c;
    c.losses = backend.awq_losses(l.w, pointers(scales), spec_of(pw, o), g, nullptr);
    const int best = first_min(c.losses);
    c.alpha = alphas[size_t(best)];
    c.scale = scales[size_t(best)];
    model.release(l.view);
    spdlog::info("awq [{}/{}] {} alpha {:.1f} {}", i + 1, total, pw.weight, c.alpha, fmt_losses(c.losses, best));
    out[pw.weight] = std::move(c);
  }
  if (!o.awqlite_disable_fuse_nodes) average_sibling_scales(plan, backend, &out);
  return out;
}

// ModelOpt's awqlite_run_per_subgraph: one search per activation over all the MatMuls reading it (the
// loss summed over them), on the grid of --awqlite_alpha_step, with its own weight statistic and scale
// formula; every sibling gets the chosen s, so the shared producer can carry one 1/s.
std::map<std::string, AwqChoice> search_per_subgraph(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                     const QuantizeOptions& o, kernels::Backend& backend,
                                                     KeptWeights* kept) {
  const std::vector<double> alphas = awq_alphas(o.awqlite_alpha_step);
  std::vector<Calibration::GridItem> items;
  for (const auto& [act, idx] : plan.siblings) {
    const int64_t K = plan.weights[idx[0]].K(), bs = plan.weights[idx[0]].resolved_block();
    int64_t NT = 0;
    for (size_t i : idx) NT += plan.weights[i].N();
    if ((K * NT) % bs != 0)
      throw Error("--awqlite_run_per_subgraph --awq_mode modelopt: the weights reading '" + act + "' have K * N = " +
                  std::to_string(K * NT) + ", not a multiple of the block " + std::to_string(bs) +
                  " (ModelOpt fails there too; use --awq_mode nibble)");
    std::vector<Loaded> ws;
    std::vector<kernels::WeightMatrix> mats;
    for (size_t i : idx) {
      ws.push_back(load_held(model, plan.weights[i], backend, kept));
      mats.push_back(ws.back().w);
    }
    const ActivationStats st = calib.stats(act, true);
    Calibration::GridItem it;
    it.id = "g" + std::to_string(items.size());
    it.x_mean.assign(st.x_mean, st.x_mean + st.K);
    it.w_mean = backend.awq_weight_mean_joint(mats, bs);
    items.push_back(std::move(it));
    for (auto& l : ws) model.release(l.view);
  }
  const auto grid = calib.numpy_grid(items, alphas, /*per_subgraph=*/true);
  std::map<std::string, AwqChoice> out;
  GramCache grams(backend, /*cholesky=*/false);
  size_t g = 0, done = 0;
  for (const auto& [act, idx] : plan.siblings) {
    const auto& scales = grid.at("g" + std::to_string(g++));
    ActivationStats st;
    const kernels::GramForm gf = grams.get(calib, act, true, &st);
    AwqChoice c;
    c.losses.assign(alphas.size(), 0.0);
    for (size_t i : idx) {
      Loaded l = load_held(model, plan.weights[i], backend, kept);
      const std::vector<double> li = backend.awq_losses(l.w, pointers(scales), spec_of(plan.weights[i], o), gf, nullptr);
      for (size_t a = 0; a < alphas.size(); ++a) c.losses[a] += li[a];
      model.release(l.view);
    }
    const int best = first_min(c.losses);
    c.alpha = alphas[size_t(best)];
    c.scale = scales[size_t(best)];
    for (size_t i : idx) {
      spdlog::info("awq [{}/{}] {} alpha {:.2f} {} (per subgraph)", ++done, plan.weights.size(),
                   plan.weights[i].weight, c.alpha, fmt_losses(c.losses, best));
      out[plan.weights[i].weight] = c;
    }
  }
  return out;
}

}  // namespace

std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& o, kernels::Backend& backend,
                                                 KeptWeights* kept) {
  if (o.awqlite_run_per_subgraph) return search_per_subgraph(model, plan, calib, o, backend, kept);
  return search_per_node(model, plan, calib, o, backend, kept);
}

// ---- AWQ-full's scales and the clip search

void awq_full_scales(OnnxModel& model, const Plan& plan, Calibration& calib, const QuantizeOptions& o,
                     kernels::Backend& backend, std::map<std::string, AwqChoice>* per_node,
                     std::map<std::string, AwqChoice>* final_scales) {
  // awq_lite_search without sibling averaging gives each node's own s*; the final scales are then
  // averaged over siblings as awq_lite_search does with fuse on.
  QuantizeOptions no_fuse = o;
  no_fuse.awqlite_disable_fuse_nodes = true;
  *per_node = modelopt::awq_lite_search(model, plan, calib, no_fuse, backend);
  *final_scales = *per_node;
  if (o.awqlite_disable_fuse_nodes || o.awqlite_run_per_subgraph) return;
  average_sibling_scales(plan, backend, final_scales);
}

void ask_token_sample(Calibration::Extras* extras) { extras->sample_tokens = kClipMaxTokens; }

TokenSampleClipSearch::TokenSampleClipSearch(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend)
    : o_(o), calib_(calib), backend_(backend) {
  if (o.zero_point_flag && o.algo == Algo::kAwqClip)
    spdlog::warn("--use_zero_point: ModelOpt's awq_clip ignores it (modelopt mode writes symmetric INT4)");
}

void TokenSampleClipSearch::search(OnnxModel& model, const Plan& plan,
                                   const std::map<std::string, AwqChoice>* per_node) {
  const std::vector<double> ratios = clip_ratio_grid(o_.awqclip_alpha_step, o_.awqclip_alpha_min);
  size_t done = 0;
  for (const auto& pw : plan.weights) {
    TensorView v = model.view(*model.initializer(pw.weight));
    kernels::WeightMatrix w{pw.dtype, v.data, pw.rows, pw.cols, pw.k_axis, {}};
    // awq_full: W ⊙ s* of this node's own search, rounded to the weight dtype (where the backend left it)
    if (per_node) w = backend_.scale_weight(w, per_node->at(pw.weight).scale.data());
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

void TokenSampleClipSearch::quantize(const PlannedWeight& pw, const kernels::WeightMatrix& w,
                                     const kernels::QuantSpec& spec, const std::vector<float>* /*awq_scale*/,
                                     kernels::QuantResult& q) {
  if (spec.zero_point) {  // ModelOpt's find_scales ignores alpha with a zero point
    backend_.rtn(w, spec, q);
    return;
  }
  backend_.rtn_ratios(w, spec, ratios_.at(pw.weight).data(), q);
}

// ---- Quantizing

kernels::WeightMatrix scale_weight(kernels::Backend& backend, const kernels::WeightMatrix& w, const float* s) {
  // On a device backend W ⊙ s stays there for the quantizer.
  return backend.scale_weight(w, s);
}

void quantize_awq_scaled(kernels::Backend& backend, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                         kernels::QuantResult& q) {
  backend.rtn(w, spec, q);
}

bool writes_zero_point(const QuantizeOptions& o) { return o.zero_point() && o.algo != Algo::kAwqClip; }

bool gather_zero_point(const QuantizeOptions& o) { return o.zero_point_flag && o.algo == Algo::kAwqLite; }

void quantize_gather(kernels::Backend& backend, const kernels::WeightMatrix& w, const kernels::QuantSpec& spec,
                     kernels::QuantResult& q) {
  backend.rtn(w, spec, q);
}

// ---- Flags

void check_supported(const QuantizeOptions& o) {
  if (const char* why = method(o.algo).modelopt_refusal)
    throw Error(std::string("--algo ") + name_of(o.algo) + " --awq_mode modelopt: " + why);
  if (o.awqlite_run_per_subgraph && o.algo == Algo::kAwqFull)
    throw Error("--awqlite_run_per_subgraph with --algo awq_full --awq_mode modelopt: ModelOpt refuses the "
                "per-subgraph search with the clip search (use --awq_mode nibble)");
  if (o.awqlite_run_per_subgraph && mixed_enabled(o) && o.searches_scales())
    throw Error("--awqlite_run_per_subgraph --awq_mode modelopt: ModelOpt refuses the per-subgraph search with "
                "mixed precision (use --awq_mode nibble)");
}

void warn_inert_flags(const QuantizeOptions& o) {
  if (o.searches_scales() && !o.awqlite_run_per_subgraph && o.awqlite_alpha_step != 0.1)
    spdlog::warn("--awqlite_alpha_step {}: no effect with --awq_mode modelopt: ModelOpt's per-node search uses "
                 "its fixed grid 0, 0.1, ..., 1 (--awq_mode nibble and --awqlite_run_per_subgraph honour it)",
                 o.awqlite_alpha_step);
}

}  // namespace nibble::modelopt

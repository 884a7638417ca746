#include "host/algo/awq.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <algorithm>
#include <numeric>

#include "host/algo/awq_parts.h"
#include "loaders/error.h"

namespace nibble {

using namespace awq_parts;

const std::vector<float>& block_clip_ratios() {
  static const std::vector<float> r = {1.0f,   0.975f, 0.95f,  0.925f, 0.9f,  0.875f, 0.85f, 0.825f,
                                       0.8f,   0.775f, 0.75f,  0.7f,   0.65f, 0.6f,   0.55f, 0.5f};
  return r;
}

// Inside the alpha search a shorter list keeps the cost down (the final weights use them all).
const std::vector<float>& search_clip_ratios() {
  static const std::vector<float> r = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f};
  return r;
}

std::vector<double> numpy_arange(double start, double stop, double step) {
  std::vector<double> out;
  if (!(step > 0)) return out;
  const int64_t n = int64_t(std::ceil((stop - start) / step));
  for (int64_t i = 0; i < n; ++i) out.push_back(start + double(i) * step);
  return out;
}

std::vector<double> awq_alphas(double step) { return numpy_arange(0.0, 1.0 + step, step); }

namespace {

// nibble: one joint search per group of siblings (they share an input, so they share s); the weight
// statistic of the siblings side by side ([K, sum N]), contiguous blocks; the loss N-weighted.
AwqChoice search_group(OnnxModel& model, const Plan& plan, const std::vector<size_t>& idx, Calibration& calib,
                       const QuantizeOptions& o, const std::vector<double>& alphas, GramCache& grams,
                       kernels::Backend& backend, KeptWeights* kept) {
  const auto& first = plan.weights[idx[0]];
  ActivationStats st;
  const kernels::GramForm g = grams.get(calib, first.activation, false, &st);
  const int64_t K = first.K();
  std::vector<Loaded> ws;
  int64_t n_total = 0;
  for (size_t i : idx) {
    ws.push_back(load(model, plan.weights[i]));
    // Read by the statistic and the loss here, and by the quantizer after the search: uploaded once.
    ws.back().w = keep_weight(backend, kept, plan.weights[i], ws.back().view.data);
    n_total += plan.weights[i].N();
  }
  std::vector<float> wm(static_cast<size_t>(K), 0.0f);
  for (size_t j = 0; j < idx.size(); ++j) {
    const auto& pw = plan.weights[idx[j]];
    const auto m = backend.awq_weight_mean(ws[j].w, pw.resolved_block(), true);
    for (int64_t k = 0; k < K; ++k) wm[size_t(k)] += m[size_t(k)] * float(pw.N()) / float(n_total);
  }
  const std::vector<float> xm(st.x_mean, st.x_mean + K);
  std::vector<std::vector<float>> scales;
  for (double a : alphas) scales.push_back(backend.awq_scale(xm, wm, a));
  std::vector<std::vector<double>> per_weight;
  for (size_t j = 0; j < idx.size(); ++j)
    per_weight.push_back(backend.awq_losses(ws[j].w, pointers(scales), spec_of(plan.weights[idx[j]], o), g,
                                            &search_clip_ratios()));
  AwqChoice c;
  for (size_t a = 0; a < alphas.size(); ++a) {
    double loss = 0;
    for (size_t j = 0; j < idx.size(); ++j)
      loss += per_weight[j][a] * double(plan.weights[idx[j]].N()) / double(n_total);
    c.losses.push_back(loss);
  }
  for (auto& l : ws) model.release(l.view);
  const int best = first_min(c.losses);
  c.alpha = alphas[size_t(best)];
  c.scale = scales[size_t(best)];
  return c;
}

}  // namespace

std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& o, kernels::Backend& backend,
                                                 KeptWeights* kept) {
  std::map<std::string, AwqChoice> out;
  GramCache grams(backend, /*cholesky=*/true);
  const std::vector<double> alphas = awq_alphas(o.awqlite_alpha_step);
  std::vector<std::vector<size_t>> groups;  // siblings together, or one per weight when each gets its own Mul
  if (!o.awqlite_disable_fuse_nodes || o.awqlite_run_per_subgraph) {
    for (const auto& kv : plan.siblings) groups.push_back(kv.second);
  } else {
    for (size_t i = 0; i < plan.weights.size(); ++i) groups.push_back({i});
  }
  size_t done = 0;
  for (const auto& idx : groups) {
    const AwqChoice c = search_group(model, plan, idx, calib, o, alphas, grams, backend, kept);
    const int best = int(std::find(alphas.begin(), alphas.end(), c.alpha) - alphas.begin());
    for (size_t i : idx) {
      spdlog::info("awq [{}/{}] {} alpha {:.2f} {}", ++done, plan.weights.size(), plan.weights[i].weight, c.alpha,
                   fmt_losses(c.losses, best));
      out[plan.weights[i].weight] = c;
    }
  }
  return out;
}

}  // namespace nibble

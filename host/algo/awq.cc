#include "host/algo/awq.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <algorithm>
#include <numeric>

#include "loaders/error.h"

namespace nibble {

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

std::vector<double> awq_alphas(double step) {
  // np.arange(0, 1 + step, step) values (i * step), as ModelOpt builds them.
  std::vector<double> out;
  const int64_t n = int64_t(std::ceil((1.0 + step) / step));
  for (int64_t i = 0; i < n; ++i) out.push_back(double(i) * step);
  return out;
}

namespace {

struct Loaded {
  TensorView view;
  kernels::WeightMatrix w;
};

Loaded load(OnnxModel& model, const PlannedWeight& pw) {
  Loaded l;
  l.view = model.view(*model.initializer(pw.weight));
  l.w = kernels::WeightMatrix{pw.dtype, l.view.data, pw.rows, pw.cols, pw.k_axis, {}};
  return l;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& v) {
  std::vector<const float*> p;
  for (const auto& x : v) p.push_back(x.data());
  return p;
}

// The Gram matrix of the activation as fp32 for sgemm, converted once per activation; in nibble mode
// also its Cholesky factor (the loss then costs one triangular product, half a GEMM).
class GramCache {
 public:
  GramCache(kernels::Backend& backend, bool cholesky) : backend_(backend), cholesky_(cholesky) {}

  // The activation's statistics and its Gram matrix in the form the loss reads.
  kernels::GramForm get(Calibration& calib, const std::string& act, bool numpy_mean, ActivationStats* stats) {
    *stats = calib.stats(act, numpy_mean);
    if (act != name_) {
      gram_kept_.reset();  // the last activation's, freed before this one's are made
      factor_ = {};
      // Kept where the backend computes it (a device keeps U for the sibling weights that read it).
      factor_ = cholesky_ ? backend_.gram_cholesky_kept(stats->gram, stats->K) : kernels::GramFactor{};
      if (cholesky_ && !factor_.ok()) spdlog::debug("awq: {}: Gram matrix not factorisable, GEMM loss", act);
      g32_ = calib.gram_f32(act);  // last: it drops the float64 pages the factorisation read
      name_ = act;
      // The GEMM form reads G itself: a device keeps it for the sibling weights too.
      if (!factor_.ok())
        gram_kept_ = backend_.keep_gram(kernels::GramForm{stats->K, stats->rows, g32_.data()}).gram_resident;
    }
    kernels::GramForm g{stats->K, stats->rows, g32_.data(), factor_.host.empty() ? nullptr : factor_.host.data(),
                        factor_.resident};
    g.gram_resident = gram_kept_;
    return g;
  }

 private:
  kernels::Backend& backend_;
  bool cholesky_;
  std::string name_;
  std::vector<float> g32_;
  kernels::GramFactor factor_;
  std::shared_ptr<const kernels::Resident> gram_kept_;
};

kernels::QuantSpec spec_of(const PlannedWeight& pw, const QuantizeOptions& o) {
  kernels::QuantSpec s;
  s.bits = pw.bits;
  s.block = pw.resolved_block();
  s.zero_point = o.use_zero_point;
  return s;
}

int first_min(const std::vector<double>& v) {
  int best = 0;
  for (int i = 1; i < int(v.size()); ++i)
    if (v[size_t(i)] < v[size_t(best)]) best = i;
  return best;
}

std::string fmt_losses(const std::vector<double>& l, int best) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "loss %.4g (alpha 0: %.4g)", l[size_t(best)], l[0]);
  return buf;
}

}  // namespace

void average_sibling_scales_modelopt(const Plan& plan, kernels::Backend& backend,
                                     std::map<std::string, AwqChoice>* choices) {
  for (const auto& [act, idx] : plan.siblings) {
    if (idx.size() < 2) continue;
    std::vector<const std::vector<float>*> scales;
    for (size_t i : idx) scales.push_back(&choices->at(plan.weights[i].weight).scale);
    const std::vector<float> mean = backend.mean_of(scales);
    for (size_t i : idx) (*choices)[plan.weights[i].weight].scale = mean;
  }
}

namespace {

// ModelOpt: one search per node on the fixed grid, with numpy's own scale arithmetic.
std::map<std::string, AwqChoice> search_modelopt(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& o, kernels::Backend& backend) {
  std::map<std::string, AwqChoice> out;
  GramCache grams(backend, /*cholesky=*/false);
  const size_t total = plan.weights.size();
  const std::vector<double> alphas = awq_alphas(0.1);
  std::vector<Calibration::GridItem> items;
  for (size_t i = 0; i < total; ++i) {
    const auto& pw = plan.weights[i];
    Loaded l = load(model, pw);
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
    Loaded l = load(model, pw);
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
  if (!o.awqlite_disable_fuse_nodes) average_sibling_scales_modelopt(plan, backend, &out);
  return out;
}

// ModelOpt's awqlite_run_per_subgraph: one search per activation over all the MatMuls reading it (the
// loss summed over them), on the grid of --awqlite_alpha_step, with its own weight statistic and scale
// formula; every sibling gets the chosen s, so the shared producer can carry one 1/s.
std::map<std::string, AwqChoice> per_subgraph_modelopt(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                       const QuantizeOptions& o, kernels::Backend& backend) {
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
      ws.push_back(load(model, plan.weights[i]));
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
      Loaded l = load(model, plan.weights[i]);
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
                                                 const QuantizeOptions& o, bool modelopt, kernels::Backend& backend,
                                                 KeptWeights* kept) {
  if (modelopt && o.awqlite_run_per_subgraph) return per_subgraph_modelopt(model, plan, calib, o, backend);
  if (modelopt) return search_modelopt(model, plan, calib, o, backend);
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

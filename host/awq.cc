#include "host/awq.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/awq_ref.h"
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
  std::vector<float> w_kn;
};

Loaded load(OnnxModel& model, const PlannedWeight& pw) {
  Loaded l;
  l.view = model.view(*model.initializer(pw.weight));
  l.w = kernels::WeightMatrix{pw.dtype, l.view.data, pw.rows, pw.cols, pw.k_axis};
  l.w_kn = kernels::logical_weight(l.w);
  return l;
}

// The Gram matrix of the activation as fp32 for sgemm, converted once per activation; in nibble mode
// also its Cholesky factor (the loss then costs one triangular product, half a GEMM).
class GramCache {
 public:
  explicit GramCache(bool cholesky) : cholesky_(cholesky) {}

  const float* get(Calibration& calib, const std::string& act, bool numpy_mean, kernels::ActivationStats* stats) {
    *stats = calib.stats(act, numpy_mean);
    if (act != name_) {
      upper_ = cholesky_ ? kernels::gram_cholesky_upper(stats->gram, stats->K) : std::vector<float>{};
      if (cholesky_ && upper_.empty()) spdlog::debug("awq: {}: Gram matrix not factorisable, GEMM loss", act);
      g32_ = calib.gram_f32(act);  // last: it drops the float64 pages the factorisation read
      name_ = act;
    }
    return g32_.data();
  }
  // U (XᵀX = UᵀU) of the activation last asked for, or nullptr.
  const float* upper() const { return upper_.empty() ? nullptr : upper_.data(); }

 private:
  bool cholesky_;
  std::string name_;
  std::vector<float> g32_;
  std::vector<float> upper_;
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

// ModelOpt's per-subgraph weight statistic: the siblings side by side ([K, sum N], row-major) viewed
// as [block, -1], each element normalised by the max of its column of that view (+1e-6), then
// averaged over the sum N. ModelOpt's reshape fails unless K * sum N is a multiple of the block.
std::vector<float> weight_mean_subgraph(const std::vector<float>& wc, int64_t K, int64_t NT, int64_t block) {
  const int64_t M = K * NT / block;
  std::vector<float> amax(static_cast<size_t>(M), 0.0f), row(static_cast<size_t>(NT)), out(static_cast<size_t>(K));
  for (int64_t f = 0; f < K * NT; ++f) amax[size_t(f % M)] = std::max(amax[size_t(f % M)], std::fabs(wc[size_t(f)]));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < NT; ++n)
      row[size_t(n)] = std::fabs(wc[size_t(k * NT + n)]) / (amax[size_t((k * NT + n) % M)] + 1e-6f);
    out[size_t(k)] = kernels::numpy_sum_f32(row.data(), NT) / float(NT);
  }
  return out;
}

// ModelOpt's awqlite_run_per_subgraph (reference §5.6): one search per activation over all the
// MatMuls reading it (the loss summed over them), on the grid of --awqlite_alpha_step, with its own
// scale formula; every sibling gets the chosen s, so the shared producer can carry one 1/s.
std::map<std::string, AwqChoice> per_subgraph_modelopt(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                       const QuantizeOptions& o) {
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
    std::vector<float> wc(size_t(K * NT));
    int64_t n0 = 0;
    for (size_t i : idx) {
      Loaded l = load(model, plan.weights[i]);
      const int64_t N = plan.weights[i].N();
      for (int64_t k = 0; k < K; ++k)
        std::copy_n(l.w_kn.begin() + k * N, N, wc.begin() + k * NT + n0);
      n0 += N;
      model.release(l.view);
    }
    const kernels::ActivationStats st = calib.stats(act, true);
    Calibration::GridItem it;
    it.id = "g" + std::to_string(items.size());
    it.x_mean.assign(st.x_mean, st.x_mean + st.K);
    it.w_mean = weight_mean_subgraph(wc, K, NT, bs);
    items.push_back(std::move(it));
  }
  const auto grid = calib.numpy_grid(items, alphas, /*per_subgraph=*/true);
  std::map<std::string, AwqChoice> out;
  GramCache grams(false);
  size_t g = 0, done = 0;
  for (const auto& [act, idx] : plan.siblings) {
    const auto& scales = grid.at("g" + std::to_string(g++));
    kernels::ActivationStats st;
    const float* g32 = grams.get(calib, act, true, &st);
    AwqChoice c;
    c.losses.assign(alphas.size(), 0.0);
    for (size_t i : idx) {
      Loaded l = load(model, plan.weights[i]);
      for (size_t a = 0; a < alphas.size(); ++a)
        c.losses[a] += kernels::awq_loss(l.w, l.w_kn, scales[a].data(), spec_of(plan.weights[i], o), g32, st.rows);
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

void average_sibling_scales_modelopt(const Plan& plan, std::map<std::string, AwqChoice>* choices) {
  // numpy's mean over axis 1 of [K, m] (m < 8: a sequential float32 sum from 0), divided by m.
  for (const auto& [act, idx] : plan.siblings) {
    if (idx.size() < 2) continue;
    const int64_t K = plan.weights[idx[0]].K();
    std::vector<float> mean(static_cast<size_t>(K));
    std::vector<float> col(idx.size());
    for (int64_t k = 0; k < K; ++k) {
      for (size_t j = 0; j < idx.size(); ++j) col[j] = choices->at(plan.weights[idx[j]].weight).scale[size_t(k)];
      mean[size_t(k)] = kernels::numpy_sum_f32(col.data(), int64_t(col.size())) / float(col.size());
    }
    for (size_t i : idx) (*choices)[plan.weights[i].weight].scale = mean;
  }
}

std::map<std::string, AwqChoice> awq_lite_search(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                 const QuantizeOptions& o, bool modelopt) {
  std::map<std::string, AwqChoice> out;
  GramCache grams(!modelopt);
  const size_t total = plan.weights.size();
  size_t done = 0;
  const bool fuse = !o.awqlite_disable_fuse_nodes;

  if (modelopt && o.awqlite_run_per_subgraph) return per_subgraph_modelopt(model, plan, calib, o);
  if (modelopt) {
    // ModelOpt: one search per node on the fixed grid, with numpy's own scale arithmetic.
    const std::vector<double> alphas = awq_alphas(0.1);
    std::vector<Calibration::GridItem> items;
    for (size_t i = 0; i < total; ++i) {
      const auto& pw = plan.weights[i];
      Loaded l = load(model, pw);
      const kernels::ActivationStats st = calib.stats(pw.activation, true);
      Calibration::GridItem it;
      it.id = "w" + std::to_string(i);
      it.x_mean.assign(st.x_mean, st.x_mean + st.K);
      it.w_mean = kernels::weight_mean(l.w_kn, pw.K(), pw.N(), pw.resolved_block(), false);
      items.push_back(std::move(it));
      model.release(l.view);
    }
    auto grid = calib.numpy_grid(items, alphas);
    for (size_t i = 0; i < total; ++i) {
      const auto& pw = plan.weights[i];
      Loaded l = load(model, pw);
      kernels::ActivationStats st;
      const float* g32 = grams.get(calib, pw.activation, true, &st);
      const auto& scales = grid.at("w" + std::to_string(i));
      AwqChoice c;
      for (const auto& s : scales)
        c.losses.push_back(kernels::awq_loss(l.w, l.w_kn, s.data(), spec_of(pw, o), g32, st.rows));
      const int best = first_min(c.losses);
      c.alpha = alphas[size_t(best)];
      c.scale = scales[size_t(best)];
      model.release(l.view);
      spdlog::info("awq [{}/{}] {} alpha {:.1f} {}", ++done, total, pw.weight, c.alpha, fmt_losses(c.losses, best));
      out[pw.weight] = std::move(c);
    }
    if (fuse) average_sibling_scales_modelopt(plan, &out);
    return out;
  }

  // nibble: one joint search per group of siblings (or per weight when each gets its own Mul).
  const std::vector<double> alphas = awq_alphas(o.awqlite_alpha_step);
  std::vector<std::vector<size_t>> groups;
  if (fuse || o.awqlite_run_per_subgraph) {
    for (const auto& kv : plan.siblings) groups.push_back(kv.second);
  } else {
    for (size_t i = 0; i < total; ++i) groups.push_back({i});
  }
  for (const auto& idx : groups) {
    const auto& first = plan.weights[idx[0]];
    kernels::ActivationStats st;
    const float* g32 = grams.get(calib, first.activation, false, &st);
    const int64_t K = first.K();
    std::vector<Loaded> ws;
    int64_t n_total = 0;
    for (size_t i : idx) {
      ws.push_back(load(model, plan.weights[i]));
      n_total += plan.weights[i].N();
    }
    // Weight statistic of the siblings side by side ([K, sum N]), contiguous blocks.
    std::vector<float> wm(static_cast<size_t>(K), 0.0f);
    for (size_t j = 0; j < idx.size(); ++j) {
      const auto& pw = plan.weights[idx[j]];
      const auto m = kernels::weight_mean(ws[j].w_kn, K, pw.N(), pw.resolved_block(), true);
      for (int64_t k = 0; k < K; ++k) wm[size_t(k)] += m[size_t(k)] * float(pw.N()) / float(n_total);
    }
    const std::vector<float> xm(st.x_mean, st.x_mean + K);
    AwqChoice c;
    std::vector<std::vector<float>> scales;
    for (double a : alphas) {
      scales.push_back(kernels::awq_scale(xm, wm, a));
      double loss = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        const auto& pw = plan.weights[idx[j]];
        loss += kernels::awq_loss(ws[j].w, ws[j].w_kn, scales.back().data(), spec_of(pw, o), g32, st.rows,
                                  &search_clip_ratios(), grams.upper()) *
                double(pw.N()) / double(n_total);
      }
      c.losses.push_back(loss);
    }
    const int best = first_min(c.losses);
    c.alpha = alphas[size_t(best)];
    c.scale = scales[size_t(best)];
    for (size_t j = 0; j < idx.size(); ++j) {
      model.release(ws[j].view);
      const auto& pw = plan.weights[idx[j]];
      done++;
      spdlog::info("awq [{}/{}] {} alpha {:.2f} {}", done, total, pw.weight, c.alpha, fmt_losses(c.losses, best));
      out[pw.weight] = c;
    }
  }
  return out;
}

}  // namespace nibble

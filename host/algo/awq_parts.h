// The pieces nibble's AWQ search (awq.cc) and ModelOpt's (modelopt_compat.cc) share: a weight as the
// backend reads it, the Gram cache, the loss bookkeeping.
#pragma once
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "host/graph/plan.h"
#include "host/options.h"
#include "kernels/backend.h"
#include "loaders/onnx_model.h"

namespace nibble::awq_parts {

struct Loaded {
  TensorView view;
  kernels::WeightMatrix w;
};

inline Loaded load(OnnxModel& model, const PlannedWeight& pw) {
  Loaded l;
  l.view = model.view(*model.initializer(pw.weight));
  l.w = kernels::WeightMatrix{pw.dtype, l.view.data, pw.rows, pw.cols, pw.k_axis, {}};
  return l;
}

inline std::vector<const float*> pointers(const std::vector<std::vector<float>>& v) {
  std::vector<const float*> p;
  for (const auto& x : v) p.push_back(x.data());
  return p;
}

// The activation's float32 Gram matrix for the losses, from XᵀX where calibration keeps it (`g64`, its
// gram_tensor): converted on the host into `host` where it is host memory (ONNX Runtime's file, the CPU's
// statistics; the float64 pages are dropped afterwards), else made on the backend from its copy (the layer
// engine's on a device: nothing crosses the bus, and the loss reads it there).
inline kernels::Tensor gram_f32_for_loss(kernels::Backend& backend, Calibration& calib, const std::string& act,
                                         const kernels::Tensor& g64, std::vector<float>& host) {
  if (!g64.data) return backend.gram_to_f32(g64);
  host = calib.gram_f32(act);
  const int64_t K = g64.shape[0];
  return kernels::host_view(DType::kFloat32, {K, K}, host.data());
}

// The Gram matrix of the activation as fp32 for sgemm, converted once per activation; in nibble mode
// also its Cholesky factor (the loss then costs one triangular product, half a GEMM). Where the layer
// engine left XᵀX on the backend, both are made there from it and nothing crosses the bus.
class GramCache {
 public:
  GramCache(kernels::Backend& backend, bool cholesky) : backend_(backend), cholesky_(cholesky) {}

  // The activation's statistics and its Gram matrix in the form the loss reads.
  kernels::GramForm get(Calibration& calib, const std::string& act, bool numpy_mean, ActivationStats* stats) {
    *stats = calib.stats(act, numpy_mean);
    if (act != name_) {
      form_ = {};  // the last activation's tensors, released before this one's are made
      g32_.clear();
      const kernels::Tensor g64 = calib.gram_tensor(act, stats->K);
      // Left where the backend computes it (a device keeps U for the sibling weights that read it).
      kernels::GramFactor f = cholesky_ ? backend_.gram_cholesky_upper(g64) : kernels::GramFactor{};
      if (cholesky_ && !f.ok()) spdlog::debug("awq: {}: Gram matrix not factorisable, GEMM loss", act);
      // Last: on the host it drops the float64 pages the factorisation read.
      const kernels::Tensor g32 = gram_f32_for_loss(backend_, calib, act, g64, g32_);
      name_ = act;
      // The GEMM form reads G itself: a device keeps it for the sibling weights too (what the failed
      // factorisation uploaded, when the backend kept it).
      form_ = kernels::GramForm{stats->K, stats->rows, g32, f.upper};
      if (!f.ok()) form_.gram = f.gram.buffer ? kernels::Tensor{g32.dtype, g32.shape, g32.data, f.gram.buffer}
                                              : backend_.upload(g32);
    }
    return form_;
  }

 private:
  kernels::Backend& backend_;
  bool cholesky_;
  std::string name_;
  std::vector<float> g32_;
  kernels::GramForm form_;  // G (host g32_, the backend's copy, or both) and U
};

inline kernels::QuantSpec spec_of(const PlannedWeight& pw, const QuantizeOptions& o) {
  kernels::QuantSpec s;
  s.bits = pw.bits;
  s.block = pw.resolved_block();
  s.zero_point = o.zero_point_flag;
  return s;
}

inline int first_min(const std::vector<double>& v) {
  int best = 0;
  for (int i = 1; i < int(v.size()); ++i)
    if (v[size_t(i)] < v[size_t(best)]) best = i;
  return best;
}

inline std::string fmt_losses(const std::vector<double>& l, int best) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "loss %.4g (alpha 0: %.4g)", l[size_t(best)], l[0]);
  return buf;
}

}  // namespace nibble::awq_parts

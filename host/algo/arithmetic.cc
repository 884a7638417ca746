#include "host/algo/arithmetic.h"

#include <spdlog/spdlog.h>

#include "host/algo/modelopt_compat.h"
#include "host/methods.h"

namespace nibble {

// Each function: `case kModelOpt` calls ModelOpt's arithmetic (modelopt_compat.h); nibble's follows the
// switch. No `default`, so a new Arithmetic is a compiler warning at every place that must choose.

void check_arithmetic(const QuantizeOptions& o) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::check_supported(o);
    case Arithmetic::kNibble: break;
  }
}

void warn_inert_arithmetic_flags(const QuantizeOptions& o) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::warn_inert_flags(o);
    case Arithmetic::kNibble: break;
  }
  if (o.searches_clip() && o.awqclip_bsz_col != 1024)
    spdlog::warn("--awqclip_bsz_col {}: no effect with --awq_mode nibble: its clip search works on the Gram "
                 "matrix, with no column chunks", o.awqclip_bsz_col);
}

bool masks_padding(const QuantizeOptions& o) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::kMasksPadding;
    case Arithmetic::kNibble: break;
  }
  return true;
}

Calibration::Extras search_calibration(const QuantizeOptions& o, const Plan& plan) {
  Calibration::Extras e = clip_calibration(o, plan);
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt:
      if (o.searches_clip()) modelopt::ask_token_sample(&e);
      break;
    case Arithmetic::kNibble: break;
  }
  return e;
}

std::map<std::string, AwqChoice> search_awq_scales(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                   const QuantizeOptions& o, kernels::Backend& backend,
                                                   std::map<std::string, AwqChoice>* per_node, KeptWeights* kept) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: {
      if (!per_node || !o.searches_clip()) return modelopt::awq_lite_search(model, plan, calib, o, backend, kept);
      std::map<std::string, AwqChoice> out;
      modelopt::awq_full_scales(model, plan, calib, o, backend, per_node, &out);
      return out;
    }
    case Arithmetic::kNibble: break;
  }
  return awq_lite_search(model, plan, calib, o, backend, kept);
}

std::unique_ptr<ClipSearch> make_clip_search(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend,
                                             OnnxModel& model, const Plan& plan,
                                             const std::map<std::string, AwqChoice>* per_node) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: {
      auto c = std::make_unique<modelopt::TokenSampleClipSearch>(o, calib, backend);
      c->search(model, plan, per_node);
      return c;
    }
    case Arithmetic::kNibble: break;
  }
  return std::make_unique<GramClipSearch>(o, calib, backend);
}

kernels::WeightMatrix scale_by_awq(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                                   const float* s, kernels::Backend& backend, kernels::QuantSpec* spec) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::scale_weight(backend, w, s);
    case Arithmetic::kNibble: break;
  }
  // nibble: W ⊙ s in fp32, its quantization scales rounded to the weight dtype; left on a device backend.
  spec->scale_dtype = pw.dtype;
  return backend.scale_weight_f32(w, s);
}

void quantize_awq_scaled(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                         const kernels::QuantSpec& spec, const std::vector<float>& s, Calibration& calib,
                         kernels::Backend& backend, kernels::QuantResult& q) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::quantize_awq_scaled(backend, w, spec, q);
    case Arithmetic::kNibble: break;
  }
  // nibble: each block picks its clip ratio by the activation-weighted error, the weight of input
  // channel k being diag(XᵀX)[k] / s[k]^2 (its energy after X ⊘ s).
  const std::vector<float> energy = backend.channel_energy(calib.gram_tensor(pw.activation, pw.K()), s.data());
  backend.rtn_weighted(w, spec, energy.data(), block_clip_ratios(), q);
}

const std::vector<float>* awq_quantizer_clip_ratios(const QuantizeOptions& o) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return nullptr;  // modelopt::quantize_awq_scaled: no clip
    case Arithmetic::kNibble: break;
  }
  return &block_clip_ratios();
}

bool rtn_searches_scale(const QuantizeOptions& o) {
  // Symmetric only (validate_options refuses rtn_lsq with --use_zero_point): nibble's zero-point search
  // measured worse perplexity than min/max (docs/numerics.md).
  if (method(o.algo).rounding.quantizer != Quantizer::kRtnLsq) return false;
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::kRtnSearchesScale;  // refused before this (check_supported)
    case Arithmetic::kNibble: break;
  }
  return true;
}

kernels::RtnArithmetic rtn_arithmetic(const QuantizeOptions& o, bool zero_point) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return kernels::RtnArithmetic::kModelOpt;
    case Arithmetic::kNibble: break;
  }
  // nibble: with a zero point every method's plain RTN is ONNX Runtime's (as good or better than ModelOpt's on
  // both bench models); without one, the grid the method's record names (Rounding::symmetric_rtn: ONNX
  // Runtime's for rtn and rtn_dq, whose 16-level search won 1-2% on two models and lost 6.3% on a third,
  // docs/numerics.md; amax / (2^(b-1) - 1) for a calibrated method's symmetric fallback).
  if (zero_point) return kernels::RtnArithmetic::kOnnxRuntime;
  return method(o.algo).rounding.symmetric_rtn;
}

bool writes_zero_point(const QuantizeOptions& o) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::writes_zero_point(o);
    case Arithmetic::kNibble: break;
  }
  return o.zero_point();
}

bool gather_zero_point(const QuantizeOptions& o) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::gather_zero_point(o);
    case Arithmetic::kNibble: break;
  }
  return o.zero_point_flag;
}

void quantize_gather(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                     const kernels::QuantSpec& spec, kernels::Backend& backend, kernels::QuantResult& q) {
  switch (o.arithmetic) {
    case Arithmetic::kModelOpt: return modelopt::quantize_gather(backend, w, spec, q);
    case Arithmetic::kNibble: break;
  }
  // nibble: each block's clip ratio by the weight error (no activations reach a table), as rtn_search.
  const std::vector<float> unit(static_cast<size_t>(pw.K()), 1.0f);
  backend.rtn_weighted(w, spec, unit.data(), block_clip_ratios(), q);
}

}  // namespace nibble

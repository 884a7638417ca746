// Where nibble's arithmetic and ModelOpt's part ways. QuantizeOptions::arithmetic (--awq_mode) is read
// here and nowhere else: each function below is one switch on it, calling nibble's own algorithm (awq.h,
// awq_clip.h, or a line here) or ModelOpt's (modelopt_compat.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "host/algo/awq.h"
#include "host/algo/awq_clip.h"
#include "host/graph/plan.h"
#include "host/options.h"
#include "kernels/backend.h"
#include "loaders/onnx_model.h"

namespace nibble {

// Refuses what the arithmetic has no algorithm for (one-line errors); warns of flags it ignores.
void check_arithmetic(const QuantizeOptions& o);
void warn_inert_arithmetic_flags(const QuantizeOptions& o);

// Whether calibration masks padding tokens out of the statistics.
bool masks_padding(const QuantizeOptions& o);
// What calibration must keep for the clip search.
Calibration::Extras search_calibration(const QuantizeOptions& o, const Plan& plan);

// AWQ's scale search of every weight of the plan. per_node: where awq_full needs each node's own s*
// besides the final scales (ModelOpt's clip search reads them), else null. kept: where nibble's search
// leaves the weights it read on the backend for the quantizer (null: dropped after the search).
std::map<std::string, AwqChoice> search_awq_scales(OnnxModel& model, const Plan& plan, Calibration& calib,
                                                   const QuantizeOptions& o, kernels::Backend& backend,
                                                   std::map<std::string, AwqChoice>* per_node = nullptr,
                                                   KeptWeights* kept = nullptr);
// The clip search of awq_clip / awq_full (per_node: awq_full's own s*, or null).
std::unique_ptr<ClipSearch> make_clip_search(const QuantizeOptions& o, Calibration& calib, kernels::Backend& backend,
                                             OnnxModel& model, const Plan& plan,
                                             const std::map<std::string, AwqChoice>* per_node);

// W ⊙ s, the weight an AWQ scale s quantizes (may set spec->scale_dtype), where the backend left it (the
// returned matrix holds its buffer).
kernels::WeightMatrix scale_by_awq(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                                   const float* s, kernels::Backend& backend, kernels::QuantSpec* spec);
// Quantizes W ⊙ s when no clip search or GPTQ follows the AWQ scale search.
void quantize_awq_scaled(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                         const kernels::QuantSpec& spec, const std::vector<float>& s, Calibration& calib,
                         kernels::Backend& backend, kernels::QuantResult& q);
// The clip ratios that quantizer tries per block (null: plain round to nearest), for measuring it.
const std::vector<float>* awq_quantizer_clip_ratios(const QuantizeOptions& o);

// Whether each block's scale is searched by least squares on 2^b levels (rtn_lsq).
bool rtn_searches_scale(const QuantizeOptions& o);
// Plain RTN's arithmetic (kernels::QuantSpec::rtn_arithmetic) for a weight with or without zero points.
kernels::RtnArithmetic rtn_arithmetic(const QuantizeOptions& o, bool zero_point);
// Whether the planned weights get zero points.
bool writes_zero_point(const QuantizeOptions& o);

// An embedding table: whether it gets zero points, and its quantizer.
bool gather_zero_point(const QuantizeOptions& o);
void quantize_gather(const QuantizeOptions& o, const PlannedWeight& pw, const kernels::WeightMatrix& w,
                     const kernels::QuantSpec& spec, kernels::Backend& backend, kernels::QuantResult& q);

}  // namespace nibble

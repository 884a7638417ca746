// The stages of `nibble quantize`, each a function with its inputs and outputs explicit:
//
//   load -> plan -> search (calibrate, AWQ scales, clip ratios, INT8 picks) -> emit (quantize each
//   weight as it streams from the map, write it) -> copy the rest -> commit -> report
//
// run_quantize (pipeline.cc) calls them in that order; tests may call one alone.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "host/algo/arithmetic.h"
#include "host/algo/awq.h"
#include "host/algo/awq_clip.h"
#include "host/algo/gptq.h"
#include "host/algo/mixed_precision.h"
#include "host/graph/plan.h"
#include "host/graph/rewrite.h"
#include "host/options.h"
#include "kernels/backend.h"
#include "loaders/model_writer.h"
#include "loaders/onnx_model.h"
#include "loaders/parallel_read.h"

namespace nibble {

// load: the model (a parsed graph and maps of its data files) and the files it reads.
struct LoadedModel {
  std::unique_ptr<OnnxModel> model;
  std::vector<std::string> input_files;
};
// Loads the model and checks every external data range before anything is written.
LoadedModel load_stage(const QuantizeOptions& o);

// plan: what to quantize, at which precision, in which format.
struct Planned {
  Plan plan;
  Format format = Format::kDq;
  MixedOutcome mixed;  // INT8 picks (static strategies here, sensitivity after calibration)
};
Planned plan_stage(const QuantizeOptions& o, OnnxModel& model);

// search: what each weight is quantized with, beyond bits and block (in the plan): the AWQ scale
// s of each weight, the clip search and the calibration statistics they read.
struct Searched {
  std::unique_ptr<Calibration> calib;
  std::map<std::string, AwqChoice> choices;  // AWQ scale per weight (awq_lite, awq_full)
  std::map<std::string, AwqChoice> per_node;  // awq_full in modelopt mode: each node's own s*
  // The method's quantizer made from the statistics (the clip search of awq_clip and awq_full, GPTQ of
  // gptq, awq_gptq and awq_learned), where it has one: it quantizes every weight emit would round.
  std::unique_ptr<CalibratedQuantizer> quantizer;
  KeptWeights kept;  // weights the searches left on a device backend for the quantizer
  double calibrate_seconds = 0, search_seconds = 0;
  // Resuming a layer-by-layer run: the weights are laid out again (the writer replays what the stopped
  // run wrote) with no quantization; only `choices` is read.
  bool replay = false;
  // Called with each weight's result as it is quantized (the quantized layers fed forward): s is its AWQ
  // scale, divisor the consumer's 1/s folded into its columns (either may be null).
  std::function<void(const PlannedWeight&, const kernels::QuantSpec&, const kernels::QuantResult&,
                     const std::vector<float>* s, const std::vector<float>* divisor)>
      on_quantized;
};
// Whether the run calibrates: its method measures something (host/methods.h), or mixed precision's
// sensitivity measure does.
bool needs_calibration(const QuantizeOptions& o);
Searched search_stage(const QuantizeOptions& o, OnnxModel& model, Planned& planned, kernels::Backend& backend);
// AWQ's scale search of the plan's weights on s.calib (search_awq_scales) into
// s.choices (and s.per_node).
void search_scales(const QuantizeOptions& o, OnnxModel& model, const Plan& plan, kernels::Backend& backend,
                   Searched& s);
// The searches of search_stage on statistics already in s.calib (the whole model's, or one layer's
// with a plan of that layer's weights).
void search_calibrated(const QuantizeOptions& o, OnnxModel& model, Planned& planned, kernels::Backend& backend,
                       Searched& s);

// emit: every planned weight quantized through the backend and written by the rewriter.
struct Emitted {
  nlohmann::json weights = nlohmann::json::array();  // the report's per-weight entries
  uint64_t bytes_in = 0, bytes_out = 0;
  double sq_error = 0;
  int64_t elements = 0;
  bool zero_point = false;
  // Layer by layer: where the layers' time went (calibration of each layer, its search), summed.
  double calibrate_seconds = 0, search_seconds = 0;
  ReadStats read;  // how the weights were read from their files
};
Emitted emit_stage(const QuantizeOptions& o, OnnxModel& model, const Planned& planned, Searched& searched,
                   GraphRewriter& rewriter, kernels::Backend& backend);

// copy the rest: every initializer the rewriter neither replaced nor wrote, streamed file to file.
uint64_t copy_rest_stage(OnnxModel& model, const GraphRewriter& rewriter, ModelWriter& writer);

// commit and report.
struct Committed {
  std::vector<std::string> companions;  // GenAI / tokenizer files copied beside the output
  uint64_t output_bytes = 0;
};
Committed commit_stage(const QuantizeOptions& o, OnnxModel& model, const Planned& planned, const Emitted& emitted,
                       GraphRewriter& rewriter, ModelWriter& writer);
// Wall seconds per stage, for the report (where a run's time went: on a GPU, whether the device's part
// matters at all). A layer-by-layer run calibrates, searches and quantizes inside `layers`: calibrate,
// search and quantize then say how `layers` divides.
struct StageSeconds {
  double load = 0, calibrate = 0, search = 0, quantize = 0, layers = 0, write = 0, total = 0;
};
// layer_pass: the pass in effect (LayerChoice::to_json), the report's summary.layer_pass.
void report_stage(const QuantizeOptions& o, const Planned& planned, const Emitted& emitted, const Committed& committed,
                  uint64_t copied, const StageSeconds& seconds, const kernels::Backend& backend,
                  const nlohmann::json& layer_pass);

}  // namespace nibble

// Everything `nibble quantize` is asked to do: ModelOpt quantize.py's flags (same names, same
// defaults) plus nibble's own. The CLI fills it; the choices among names (algorithm, mode, format,
// device, mixed strategy) are typed here once, at the edge (parse_* below), and every stage reads
// the enums. Echoed in the report.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "kernels/backend.h"

namespace nibble {

// One record per value in the method registry (host/methods.h): what each is called, what it calibrates,
// whether ModelOpt's arithmetic covers it, its default format.
enum class Algo { kAwqLite, kAwqClip, kAwqFull, kRtn, kRtnDq, kGptq, kAwqGptq, kRtnSearch, kRtnLsq, kHqq, kAwqLearned,
                  kAwqLearnedLayer };
constexpr Algo kLastAlgo = Algo::kAwqLearnedLayer;  // a new Algo goes after it, and moves it: the registry's test walks 0..last
// Whose arithmetic the algorithms follow (--awq_mode): nibble's own, or ModelOpt 0.47's with its quirks,
// for bit-exact codes (host/algo/modelopt_compat.h). host/algo/arithmetic.h is where the two part.
enum class Arithmetic { kNibble, kModelOpt };
// One record per value in the format registry (host/formats.h): its name, what the graph needs, its byte model.
enum class Format { kDq, kQdq, kMatMulNBits };
constexpr Format kLastFormat = Format::kMatMulNBits;  // as kLastAlgo: the registry's test walks 0..last
// Who picks the INT8 weights: nobody (all INT4), ModelOpt's default rule, --layers_8bit, or nibble's
// sensitivity measure.
enum class MixedStrategy { kNone, kModelopt, kLayers8bit, kSensitivity };
// --layer_by_layer: layer by layer whenever the graph can be cut and it helps (auto), always where it can (on),
// or the whole-model pass (off). host/run/pipeline.cc decides what auto becomes, and says why.
enum class LayerMode { kAuto, kOn, kOff };

struct QuantizeOptions {
  // ModelOpt (examples/windows/onnx_ptq/genai_llm/quantize.py)
  std::string onnx_path;
  std::string output_path;
  Algo algo = Algo::kAwqLite;
  int64_t block_size = 128;
  bool zero_point_flag = false;  // --use_zero_point as given
  double awqlite_alpha_step = 0.1;
  bool awqlite_run_per_subgraph = false;
  bool awqlite_disable_fuse_nodes = false;
  double awqclip_alpha_step = 0.05;
  double awqclip_alpha_min = 0.5;
  int64_t awqclip_bsz_col = 1024;
  // GPTQ (nibble's own; AutoGPTQ's and ONNX Runtime's names and defaults)
  double gptq_percdamp = 0.01;
  bool gptq_act_order = false;
  // awq_learned (host/algo/learned_rounding.h): AutoRound's sign steps and first step size (in levels).
  int learned_iters = 0;
  double learned_lr = 0.005;
  // awq_learned_layer (calib/layer_learning.h): sign steps per layer and the first step (0: 1 / steps).
  int learned_layer_iters = 50;
  double learned_layer_lr = 0;
  int learned_layer_samples = 1;  // calibration samples per step (0: the engine's joined batches)
  bool learned_layer_from_gptq = false;  // start from awq_gptq's codes and scales instead of awq_lite's
  bool learned_layer_sweeps = false;  // start from awq_learned's: GPTQ's codes refined by its greedy sweeps
  bool learned_layer_unweighted = false;  // every token's row weighs the same in the objective
  bool enable_mixed_quant = false;
  std::string layers_8bit;
  std::optional<int> gather_quantize_axis;  // axis of the [V, H] table the blocks run along; absent: float
  int64_t gather_block_size = 32;
  bool use_column_major = false;
  std::vector<std::string> nodes_to_exclude{"/lm_head"};
  // The calibration flags (ModelOpt's and nibble's: --calib_data, --calib_seq_len, --calib_cache).
  CalibrationOptions calib;
  // nibble's own
  MixedStrategy mixed_strategy_flag = MixedStrategy::kNone;  // --mixed_strategy as given (kNone: absent)
  std::string mixed_budget;  // sensitivity: share of the weights at 8 bits (0..1) or an output size (300MB)
  Arithmetic arithmetic = Arithmetic::kNibble;  // --awq_mode
  kernels::Device device = kernels::Device::kAuto;
  uint64_t device_memory = 0;    // --device_memory in bytes; 0: free device memory less a margin (emulated: 1 GiB)
  std::optional<Format> format;  // absent: the method's default (qdq for rtn, dq for the others)
  int threads = 0;               // 0: all cores
  bool force = false;
  // Calibrate, search and quantize one decoder layer at a time (host/run/layers.h); --resume continues
  // a stopped run from its first unfinished layer.
  LayerMode layer_by_layer = LayerMode::kAuto;
  bool resume = false;
  bool feed_quantized = false;  // layer L+1 calibrated on the outputs of the quantized layers 0..L
  bool calibrate_first = false;  // each layer group calibrated just before its search, not beside the one before
  std::string report;
  std::string config;
  bool quiet = false;
  bool verbose = false;

  Format resolved_format() const;
  // What the method's record measures (host/methods.h): input scales s (awq_lite, awq_full, awq_gptq), clip
  // ratios (awq_clip, awq_full), GPTQ (gptq, awq_gptq).
  bool searches_scales() const;
  bool searches_clip() const;
  bool uses_gptq() const;
  // awq_learned_layer started from GPTQ's codes (--learned_layer_from_gptq or --learned_layer_sweeps).
  bool learns_layers_from_gptq() const;
  // Whether the method writes zero points: --use_zero_point, or always where its record says it fits them
  // (hqq).
  bool zero_point() const;
  // The mixed strategy in effect (--layers_8bit and --enable_mixed_quant imply one).
  MixedStrategy mixed_strategy() const;
};

// Names to enums (throw Error naming the flag and the choices) and back.
Algo parse_algo(const std::string& s);
Arithmetic parse_awq_mode(const std::string& s);  // --awq_mode nibble|modelopt
Format parse_format(const std::string& s);
// --gather_quantize_axis: 0 or 1 (-2 / -1 count from the back of the 2-D table), one-line error otherwise.
int parse_gather_axis(const std::string& s);
kernels::Device parse_device(const std::string& s);
MixedStrategy parse_mixed_strategy(const std::string& s);
// --layer_by_layer auto|on|off; "" (the flag alone) and true/false (a preset's boolean) keep the old
// boolean spelling working.
LayerMode parse_layer_mode(const std::string& s);
CalibrationEngine parse_calibration_engine(const std::string& s);
const char* name_of(CalibrationEngine e);
const char* name_of(Algo a);
const char* name_of(Arithmetic a);
const char* name_of(Format f);
const char* name_of(kernels::Device d);
const char* name_of(MixedStrategy m);  // "" for kNone
const char* name_of(LayerMode m);

}  // namespace nibble

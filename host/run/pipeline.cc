// `nibble quantize`: the stages of host/run/stages.h in order, and the checks of the options.
#include "host/run/pipeline.h"

#include "calib/engine_calibration.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include "host/formats.h"
#include "host/methods.h"
#include "host/run/layer_choice.h"
#include "host/run/layers.h"
#include "host/run/stages.h"
#include "kernels/parallel.h"
#include "loaders/error.h"

namespace nibble {
namespace {

// What the method's record says about zero points that --use_zero_point and --format do not: that it writes
// them anyway, or rounds its fractional ones where the format takes integers only.
void note_zero_points(const QuantizeOptions& o) {
  const Method& m = method(o.algo);
  if (m.rounding.zero_point == ZeroPointPolicy::kAlways && !o.zero_point_flag)
    spdlog::info("--algo {}: writes UINT4/UINT8 codes with zero points ({}), as with --use_zero_point", m.name,
                 m.rounding.zero_point_why);
  const Format f = o.resolved_format();
  if (!m.rounding.fractional_zero_points || format_record(f).float_zero_point_bits) return;
  for (const FormatRecord& keeps : formats())
    if (keeps.float_zero_point_bits) {
      spdlog::info("--algo {} --format {}: zero points rounded to integers (DequantizeLinear takes integer ones "
                   "only); --format {} keeps its fractional zero points, more accurate", m.name, name_of(f),
                   keeps.name);
      return;
    }
}

// Flags ModelOpt's command line has that change nothing in this configuration: one line each.
void warn_inert_flags(const QuantizeOptions& o) {
  if (o.gather_block_size != 32 && !o.gather_quantize_axis)
    spdlog::warn("--gather_block_size {}: no effect without --gather_quantize_axis (as in ModelOpt, the axis "
                 "turns Gather quantization on): embeddings stay float", o.gather_block_size);
  warn_inert_arithmetic_flags(o);
  const bool gptq_start = o.learns_layers_from_gptq();
  const bool sweeps_start = gptq_start && o.learned_layer_sweeps;
  for (const MethodFlag& f : method_flags())
    if (!f.read_by(method(o.algo)) && !(gptq_start && f.read_by_gptq_start) &&
        !(sweeps_start && f.read_by_sweeps_start) && flag_given(f, o)) {
      const std::string readers = method_names(f.read_by);
      spdlog::warn("--{}{}: no effect: --algo {} {} ({} {})", f.name,
                   f.switch_value ? std::string() : " " + flag_value(f, o).dump(), name_of(o.algo),
                   f.others_lack, readers, readers.find(" and ") == std::string::npos ? "does" : "do");
    }
  note_zero_points(o);
  if (!needs_calibration(o) && o.calib.engine == CalibrationEngine::kNative)
    spdlog::warn("--calibration_engine native: no effect: --algo {} runs no calibration", name_of(o.algo));
  if (needs_calibration(o) && o.calib.engine == CalibrationEngine::kNative && o.calib.calibration_eps_given)
    spdlog::warn("--calibration_eps {}: no effect: --calibration_engine native runs the model on nibble's own "
                 "engine, on the CPU", o.calib.calibration_eps);
  if (!needs_calibration(o))
    for (const auto& [on, flag] : {std::pair{o.calib.use_random_calib, "--use_random_calib"},
                                   {o.calib.add_position_ids, "--add_position_ids"},
                                   {o.calib.no_position_ids, "--no_position_ids"}})
      if (on) spdlog::warn("{}: no effect: --algo {} runs no calibration", flag, name_of(o.algo));
}

// --calibration_engine auto: the layer engine where it can measure what this run asks for, else ONNX Runtime,
// and o.calib.engine_fallback says why (logged, and in the report).
CalibrationEngine choose_calibration_engine(QuantizeOptions& o) {
  if (o.calib.engine != CalibrationEngine::kAuto) return o.calib.engine;
  std::string& why = o.calib.engine_fallback;
  if (o.arithmetic == Arithmetic::kModelOpt)
    why = "--awq_mode modelopt measures ModelOpt's statistics through ONNX Runtime";
  else if (!o.calib.calib_cache.empty())
    why = "--calib_cache keeps ONNX Runtime's statistics files";
  else if (o.calib.calibration_eps_given)
    why = "--calibration_eps names ONNX Runtime's execution providers";
  else if (o.feed_quantized && o.resume)
    why = "a resumed --feed_quantized run feeds the finished layers from their checkpoints";
  else if (const std::string missing = layer_engine_cannot_run(o.onnx_path); !missing.empty())
    why = "the layer engine cannot run " + missing;
  if (why.empty()) return CalibrationEngine::kNative;
  if (!o.quiet && why.rfind("the layer engine", 0) == 0) spdlog::info("calibration: ONNX Runtime ({})", why);
  return CalibrationEngine::kOrt;  // the other reasons are flags the user gave: the report says it
}

}  // namespace

void validate_options(const QuantizeOptions& o) {
  if (!(o.awqclip_alpha_step > 0 && o.awqclip_alpha_step <= 1)) throw Error("--awqclip_alpha_step must be in (0, 1]");
  if (!(o.awqclip_alpha_min > 0 && o.awqclip_alpha_min <= 1)) throw Error("--awqclip_alpha_min must be in (0, 1]");
  if (o.awqclip_bsz_col < 1) throw Error("--awqclip_bsz_col must be at least 1");
  if (const Method& m = method(o.algo); m.rounding.zero_point == ZeroPointPolicy::kRefused && o.zero_point_flag)
    throw Error(std::string("--algo ") + m.name + " --use_zero_point: " + m.rounding.zero_point_why);
  if (o.awqlite_alpha_step <= 0 || o.awqlite_alpha_step > 1) throw Error("--awqlite_alpha_step must be in (0, 1]");
  if (o.calib.calib_size < 1) throw Error("--calib_size must be at least 1");
  if (o.calib.batch_size < 1) throw Error("--batch_size must be at least 1");
  if (o.calib.calib_seq_len < 1) throw Error("--calib_seq_len must be at least 1");
  const int64_t b = o.block_size;
  if (b != -1 && (b < 16 || (b & (b - 1)) != 0))
    throw Error("--block_size " + std::to_string(b) + " must be a power of two >= 16, or -1 for per-channel");
  validate_mixed_options(o);
  for (const MethodFlag& f : method_flags()) {
    const double v = f.int_value ? double(o.*f.int_value) : f.double_value ? o.*f.double_value : 0;
    if (!f.switch_value && !(v >= f.min && v <= f.max))
      throw Error(fmt::format("--{} must be in [{}, {}]", f.name, f.min, f.max));
  }
  check_arithmetic(o);
  const int64_t gb = o.gather_block_size;
  if (o.gather_quantize_axis && (gb < 16 || (gb & (gb - 1)) != 0))
    throw Error("--gather_block_size " + std::to_string(gb) + " must be a power of two >= 16 (GatherBlockQuantized "
                "takes no other)");
  if (o.use_column_major) throw Error("--use_column_major is not implemented yet");
  if (o.threads < 0) throw Error("--threads must be >= 0");
  if (o.onnx_path.empty()) throw Error("--onnx_path is required");
  if (o.resume && o.layer_by_layer == LayerMode::kOff)
    throw Error("--resume continues a --layer_by_layer run: not with --layer_by_layer off");
  if (o.feed_quantized && o.layer_by_layer == LayerMode::kOff)
    throw Error("--feed_quantized feeds the quantized layers forward layer by layer: not with --layer_by_layer off");
  if (o.output_path.empty()) throw Error("--output_path is required");
  if (const Method& m = method(o.algo); m.learns_layers) {
    const std::string a = std::string("--algo ") + m.name;
    if (o.layer_by_layer == LayerMode::kOff)
      throw Error(a + " learns one decoder layer at a time: not with --layer_by_layer off");
    if (o.resume)
      throw Error(a + " --resume: not supported (the learned layers' activations are not checkpointed): run it again "
                      "with --force");
    if (o.calib.engine == CalibrationEngine::kOrt)
      throw Error(a + " runs the layers on nibble's layer engine: not with --calibration_engine ort");
  }
  if (o.calib.engine == CalibrationEngine::kNative) {
    if (o.arithmetic == Arithmetic::kModelOpt)
      throw Error("--calibration_engine native: --awq_mode modelopt measures ModelOpt's statistics through ONNX "
                  "Runtime (use --calibration_engine ort)");
    if (o.feed_quantized && o.resume)
      throw Error("--calibration_engine native --feed_quantized keeps the quantized layers in memory: a resumed run "
                  "cannot feed the finished ones forward (use --calibration_engine ort)");
    if (!o.calib.calib_cache.empty())
      throw Error("--calib_cache keeps ONNX Runtime's statistics files: not with --calibration_engine native");
  }
}

int run_quantize(const QuantizeOptions& given) {
  const auto t0 = std::chrono::steady_clock::now();
  validate_options(given);
  warn_inert_flags(given);
  QuantizeOptions o = given;  // with the layer engine opened, when it calibrates
  kernels::set_num_threads(o.threads);
  std::string why;
  kernels::BackendOptions bopt;
  bopt.device = o.device;
  bopt.device_memory = o.device_memory;
  auto backend = kernels::make_backend(bopt, &why);
  // The layer engine holds activations on a device backend: it goes first.
  struct DropEngine {
    QuantizeOptions& o;
    ~DropEngine() { o.calib.layer_engine.reset(); }
  } drop_engine{o};

  StageSeconds secs;
  auto lap = [mark = t0]() mutable {  // seconds since the last lap
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - mark).count();
    mark = now;
    return s;
  };
  LoadedModel loaded = load_stage(o);
  OnnxModel& model = *loaded.model;
  Planned planned = plan_stage(o, model);
  const LayerChoice layers = choose_layer_pass(o, planned);
  if (needs_calibration(o) && choose_calibration_engine(o) == CalibrationEngine::kNative)
    o.calib.layer_engine = std::make_shared<EngineCalibration>(o.calib, o.onnx_path, *backend);
  const auto& groups = layers.groups;
  if (const Method& m = method(o.algo); m.learns_layers && (groups.empty() || !o.calib.layer_engine))
    throw Error(std::string("--algo ") + m.name + " learns each decoder layer on the layer engine: " +
                (groups.empty() ? "this run takes the whole-model pass (" + layers.why + ")"
                                : "the engine does not calibrate this run (" + o.calib.engine_fallback + ")"));
  secs.load = lap();
  Searched searched;
  if (groups.empty()) {
    searched = search_stage(o, model, planned, *backend);
    secs.calibrate = searched.calibrate_seconds;
    secs.search = lap() - secs.calibrate;
  }

  ModelWriter::Options wopt;
  wopt.force = o.force;
  wopt.protected_paths = loaded.input_files;
  std::unique_ptr<LayerStateLock> state_lock;  // held until the state folder is removed
  // A failure before any layer is finished leaves no state folder (destroyed after the writer below).
  struct DropUnfinishedState {
    const QuantizeOptions* o = nullptr;
    ~DropUnfinishedState() {
      if (o && std::uncaught_exceptions() > 0) remove_layer_state_if_nothing_finished(*o);
    }
  } drop_unfinished;
  if (!groups.empty()) {
    state_lock = open_layer_state(o, groups.size());
    drop_unfinished.o = &o;
    wopt = layer_writer_options(o, wopt);
  }
  ModelWriter writer(o.output_path, wopt);
  GraphRewriter rewriter(model.proto(), planned.format, writer, *backend);
  // Logged only now (layer by layer: after the first layer's calibration): bad input fails with its one
  // error line and nothing else.
  const auto announce = [&] {
    log_layer_pass(layers);
    spdlog::info("{}; {}", why, backend->describe());
  };
  if (groups.empty()) announce();
  const Emitted emitted = groups.empty()
                              ? emit_stage(o, model, planned, searched, rewriter, *backend)
                              : layer_by_layer_stage(o, model, planned, groups, rewriter, writer, *backend, announce);
  (groups.empty() ? secs.quantize : secs.layers) = lap();
  if (!groups.empty()) {
    secs.calibrate = emitted.calibrate_seconds;
    secs.search = emitted.search_seconds;
    secs.quantize = std::max(0.0, secs.layers - secs.calibrate - secs.search);
  }
  const uint64_t copied = copy_rest_stage(model, rewriter, writer);
  const Committed committed = commit_stage(o, model, planned, emitted, rewriter, writer);
  if (!groups.empty()) remove_layer_state(o);
  secs.write = lap();
  secs.total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report_stage(o, planned, emitted, committed, copied, secs, *backend, layers.to_json());
  return 0;
}

}  // namespace nibble

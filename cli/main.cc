// The `nibble` command line: ModelOpt quantize.py's flags by their names and defaults, plus
// nibble's own. Library code throws; only this file prints errors and picks exit codes.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>

#include "host/run/eval.h"
#include "host/formats.h"
#include "host/methods.h"
#include "host/options.h"
#include "host/text.h"
#include "host/run/pipeline.h"
#include "cli/blas_startup.h"
#include "cli/heap_startup.h"
#include "loaders/error.h"

namespace {

// The flags whose values are names: kept as text until parsed into the options' enums.
struct NamedChoices {
  std::string algo = "awq_lite", awq_mode = "nibble", format, device = "auto", mixed_strategy, device_memory,
      gather_quantize_axis, layer_by_layer = "auto", calibration_engine = "auto";
};

// The quantize flags in three parts (the --help order): input, output and algorithm; calibration; precision,
// format and the run.
void add_algorithm_flags(CLI::App& q, nibble::QuantizeOptions& o, NamedChoices& c) {
  q.add_option("--onnx_path", o.onnx_path, "Input ONNX model (external data beside it)")->required();
  q.add_option("--output_path", o.output_path,
               "Output ONNX model; its weights go to OUTPUT.<hash>.data beside it (<hash>: 16 hex digits of the "
               "file's content hash). A missing folder is created")
      ->required();
  q.add_option("--algo", c.algo, nibble::methods_help())->capture_default_str();
  q.add_option("--block_size", o.block_size,
               "Elements per quantization block along the reduction dimension K: a power of two >= 16, "
               "or -1 for one block per output channel")
      ->capture_default_str();
  q.add_flag("--use_zero_point", o.zero_point_flag,
             "Asymmetric UINT4 codes with a zero point per block (nibble honours it for RTN too; "
             "ModelOpt's RTN ignores it)");
  q.add_option("--awqlite_alpha_step", o.awqlite_alpha_step, "AWQ-lite: step of the alpha grid in [0, 1]")
      ->capture_default_str();
  q.add_flag("--awqlite_run_per_subgraph", o.awqlite_run_per_subgraph,
             "AWQ-lite: one joint search for all MatMuls sharing an input");
  q.add_flag("--awqlite_disable_fuse_nodes", o.awqlite_disable_fuse_nodes,
             "AWQ-lite: one Mul per weight for 1/s instead of folding it into the producer");
  q.add_option("--awqclip_alpha_step", o.awqclip_alpha_step, "AWQ-clip: step of the clip-ratio grid")
      ->capture_default_str();
  q.add_option("--awqclip_alpha_min", o.awqclip_alpha_min, "AWQ-clip: smallest clip ratio")->capture_default_str();
  q.add_option("--awqclip_bsz_col", o.awqclip_bsz_col, "AWQ-clip: output columns per search chunk (modelopt mode: ModelOpt's chunk, which decides numpy's summation order for a one-column chunk)")
      ->capture_default_str();
  for (const nibble::MethodFlag& f : nibble::method_flags()) {  // the methods' own (host/methods.cc)
    const std::string name = std::string("--") + f.name;
    if (f.switch_value) q.add_flag(name, o.*f.switch_value, f.help);
    else if (f.int_value) q.add_option(name, o.*f.int_value, f.help)->capture_default_str();
    else q.add_option(name, o.*f.double_value, f.help)->capture_default_str();
  }
}

void add_calibration_flags(CLI::App& q, nibble::QuantizeOptions& o, NamedChoices& c) {
  q.add_option("--calibration_engine", c.calibration_engine,
               "What runs the model on the calibration data: native (nibble's own layer engine, on the CPU), "
               "ort (ONNX Runtime in a Python process), or auto: native wherever it can run the model and the "
               "run's statistics (not --awq_mode modelopt, --calib_cache, --calibration_eps, --feed_quantized "
               "--resume), else ort")
      ->capture_default_str();
  q.add_option("--calibration_eps", o.calib.calibration_eps,
               "ONNX Runtime execution providers for calibration, in order of preference (cuda, cpu, dml, "
               "NvTensorRtRtx)")
      ->capture_default_str();
  q.add_option("--calib_size", o.calib.calib_size, "Number of calibration samples")->capture_default_str();
  q.add_option("--dataset", o.calib.dataset, "Calibration text: cnn, pilevel, or a local .txt/.jsonl/.parquet file")
      ->capture_default_str();
  q.add_option("--batch_size", o.calib.batch_size, "Calibration batch size")->capture_default_str();
  q.add_flag("--no_position_ids", o.calib.no_position_ids, "Calibration: do not feed position_ids");
  q.add_flag("--add_position_ids", o.calib.add_position_ids, "Calibration: feed position_ids (DML-built GenAI models)");
  q.add_flag("--no_past_kv_inputs", o.calib.no_past_kv_inputs, "Calibration: the model has no past key/value inputs");
  q.add_flag("--use_buffer_share", o.calib.use_buffer_share, "Calibration: past KV sized to the context length");
  q.add_flag("--use_fp32", o.calib.use_fp32, "Calibration: past KV in fp32 (default: the model's own input dtype)");
  q.add_flag("--use_random_calib", o.calib.use_random_calib, "Calibration: random token ids instead of a dataset (--calib_size x "
             "--calib_seq_len, fixed seed: two runs give the same model; no tokenizer needed)");
}

void add_precision_and_run_flags(CLI::App& q, nibble::QuantizeOptions& o, NamedChoices& c) {
  q.add_flag("--enable_mixed_quant", o.enable_mixed_quant,
             "Mixed precision: some weights INT8 per channel, the rest INT4 (which ones: --mixed_strategy)");
  q.add_option("--layers_8bit", o.layers_8bit,
               "Comma-separated node-name patterns quantized to INT8, matched as token subsequences of node "
               "names (layers.1 matches /model/layers.1/... but not layers.10; implies --enable_mixed_quant)");
  q.add_option("--mixed_strategy", c.mixed_strategy,
               "Which weights get INT8: modelopt (ModelOpt's default set: qkv/v/down projections of the first and "
               "last eighth of the layers and every third between; the default) or sensitivity (the weights whose "
               "output error drops most per extra byte, measured on calibration data; implies "
               "--enable_mixed_quant)");
  q.add_option("--mixed_budget", o.mixed_budget,
               "sensitivity: share of the weights' elements at 8 bits (0..1) or an output size such as 300MB or "
               "1.2GiB (KB/MB/GB: powers of 1000, KiB/MiB/GiB: of 1024; default: the size ModelOpt's default "
               "choice gives)");
  q.add_option("--gather_quantize_axis", c.gather_quantize_axis,
               "Quantize the constant 2-D data of Gather nodes (the embedding table [V, H]) to INT4 in blocks "
               "along this axis (1: along H, each token's row in blocks; 0: along V). Absent: embeddings stay "
               "float. --format matmulnbits writes com.microsoft.GatherBlockQuantized, dq/qdq "
               "DequantizeLinear -> Gather");
  q.add_option("--gather_block_size", o.gather_block_size,
               "Block size for Gather quantization (a power of two >= 16; needs --gather_quantize_axis)")
      ->capture_default_str();
  q.add_flag("--use_column_major", o.use_column_major, "Store DQ weights transposed (not implemented yet)");
  q.add_option("--nodes_to_exclude", o.nodes_to_exclude,
               "Regexes matched at the start of node names (Python re.match); matching nodes stay float. "
               "Default: /lm_head. Pass '' to exclude nothing")
      ->capture_default_str();
  q.add_option("--awq_mode", c.awq_mode,
               "AWQ and RTN arithmetic: nibble (contiguous blocks, honoured alpha step, padding masked, joint "
               "sibling search; clip search on all calibration tokens through XᵀX; RTN's least-squares scale "
               "search on 16 levels) or modelopt (ModelOpt 0.47's arithmetic and quirks, for bit-exact comparison)")
      ->capture_default_str();
  q.add_option("--calib_data", o.calib.calib_data, "Calibration from an .npz of ready model inputs (axis 0 = samples) "
               "instead of --dataset");
  q.add_option("--calib_seq_len", o.calib.calib_seq_len, "Tokens per calibration sample (ModelOpt: 512)")
      ->capture_default_str();
  q.add_option("--calib_cache", o.calib.calib_cache, "Keep the calibration statistics in this folder and reuse them "
               "when the model, data and settings match");
  q.add_option("--model_name", o.calib.model_name, "Folder with the tokenizer (default: the model's folder)");
  q.add_option("--device", c.device,
               "auto, cuda, cpu or cuda_emulated (auto: CUDA when a device is present; cuda_emulated: the CUDA "
               "backend's code with the host as the device, for testing)")
      ->capture_default_str();
  q.add_option("--device_memory", c.device_memory,
               "Device memory the CUDA backend may hold, e.g. 8GiB (KB/MB/GB: powers of 1000, KiB/MiB/GiB: of "
               "1024; default: the free memory less a margin; cuda_emulated: 1GiB); larger weights and Gram "
               "matrices go through in panels");
  q.add_option("--format", c.format, nibble::formats_help());
  q.add_option("--threads", o.threads, "Worker threads (0: all cores)")->capture_default_str();
  q.add_flag("--force", o.force, "Overwrite an existing output model (never the input)");
  // An option whose value may be left out: `--layer_by_layer` alone (the old boolean flag) leaves "" = on.
  q.add_option("--layer_by_layer", c.layer_by_layer,
               "auto (default), on or off; alone: on. Calibrate, search and quantize one decoder layer at a time: "
               "memory and temporary disk hold one layer's statistics and the calibration windows' boundary "
               "activations, whatever the depth (with --mixed_strategy sensitivity a first sweep over the layers "
               "measures every weight at 4 and 8 bits before the INT8 set is chosen: one more calibration pass per "
               "layer). auto: layer by layer when the algorithm calibrates and the graph can be cut into layers; "
               "the whole-model pass for --awq_mode modelopt, --calib_cache and graphs without layers (one line "
               "says which and why)")
      ->expected(0, 1)
      ->type_name("auto|on|off");
  q.add_flag("--feed_quantized", o.feed_quantized,
             "Layer by layer: calibrate each layer on the outputs of the already-quantized layers before "
             "it (as sequential GPTQ and AutoAWQ do) instead of the float model's (the sensitivity sweep of "
             "--mixed_strategy sensitivity always feeds the float layers)");
  q.add_flag("--calibrate_first", o.calibrate_first,
             "Layer by layer: calibrate each layer group just before its search instead of beside the search of "
             "the group before (the default on the CPU): less peak memory, the next group's statistics not held "
             "while one is searched (2-layer 7B-shaped awq_lite: 3.36 GB against 3.99 GB), and no slower where "
             "the search keeps every core busy; beside it was 1-5.5 s faster on SmolLM2-135M awq_lite. With "
             "awq_learned_layer the next group's scale search, run beside this group's learning by default, "
             "waits too (the same bytes)");
  q.add_flag("--resume", o.resume,
             "Layer by layer: continue a stopped run (same flags) from its first unfinished layer (or "
             "unmeasured layer of the sensitivity sweep)");
  q.add_option("--report", o.report, "Write a JSON report: flags, per-weight shape, bits, block, error, timings");
  q.add_flag("--quiet", o.quiet, "Only warnings and errors");
  q.add_flag("--verbose", o.verbose, "Debug output (skipped nodes and why)");
}

void add_quantize_flags(CLI::App& q, nibble::QuantizeOptions& o, NamedChoices& c) {
  add_algorithm_flags(q, o, c);
  add_calibration_flags(q, o, c);
  add_precision_and_run_flags(q, o, c);
}

// Presets (--config FILE, configs/*.toml). CLI11 2.1.2 (Debian 12) reads a config file only for the
// top-level app: App::_process_config_file() is never called for a subcommand, so
// `quantize->set_config(...)` parsed the option and silently ignored the file. nibble reads the file
// itself, with CLI11's own TOML/INI parser, from --config's callback: CLI11 runs option callbacks in
// the order the options were added, --config first, and checks required options only after every
// callback, so a preset may give --onnx_path too and the flags that follow see its values.
// A key is applied only when the command line did not give that flag (the command line wins).
// Unknown keys, sections other than [quantize], and values that do not convert are errors naming
// the file; so is a file that cannot be read.
void apply_config(CLI::App& q, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CLI::FileError("--config " + path + ": no such file");
  if (!fs::is_regular_file(path, ec)) throw CLI::FileError("--config " + path + ": not a regular file");
  std::ifstream in(path);
  if (!in) throw CLI::FileError("--config " + path + ": cannot read it (" + std::strerror(errno) + ")");
  CLI::ConfigTOML format;
  std::vector<CLI::ConfigItem> items;
  try {
    items = format.from_config(in);
  } catch (const CLI::Error& e) {
    throw CLI::ConfigError("--config " + path + ": " + e.what());
  }
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // a section opens / closes
    if (!item.parents.empty() && !(item.parents.size() == 1 && item.parents[0] == q.get_name()))
      throw CLI::ConfigError("--config " + path + ": unknown section or dotted key '" + item.fullname() +
                             "' (keys are flag names without '--', at the top or under [" + q.get_name() + "])");
    CLI::Option* op = q.get_option_no_throw("--" + item.name);
    if (op == nullptr || op == q.get_help_ptr() || op == q.get_option_no_throw("--config"))
      throw CLI::ConfigError("--config " + path + ": unknown key '" + item.name +
                             "' (keys are the flag names of `nibble quantize --help` without '--')");
    if (op->count() > 0) continue;  // given on the command line: the command line wins
    try {
      if (op->get_expected_min() == 0) {  // a flag: true/false/1/0
        op->add_result(op->get_flag_value(item.name, format.to_flag(item)));
      } else {
        // An empty TOML array (nodes_to_exclude = []) means an empty list, not "use the default".
        op->add_result(item.inputs.empty() ? std::vector<std::string>{""} : item.inputs);
      }
      op->run_callback();
    } catch (const CLI::Error& e) {
      throw CLI::ConfigError("--config " + path + ": " + item.name + ": " + e.what());
    }
  }
}

// `nibble eval`: perplexity and, against a reference, KL divergence and top-1 agreement.
CLI::App* add_eval_command(CLI::App& app, nibble::EvalOptions& eval_opts) {
  CLI::App* eval = app.add_subcommand(
      "eval", "Perplexity of a model; with --reference, also KL(P_reference || P_model) and top-1 agreement");
  eval->add_option("--model", eval_opts.model, "ONNX model to measure (tokenizer.json beside it)")->required();
  eval->add_option("--reference", eval_opts.reference,
                   "Reference (float) model: adds its perplexity, the mean per-token KL(P_reference || P_model) "
                   "and the top-1 agreement over the same windows");
  eval->add_option("--text", eval_opts.text,
                   "Text to measure on: a .txt file, or .jsonl with a \"text\" field per line (default: the "
                   "corpus eval split of tools/corpus.py, never used for calibration)");
  eval->add_option("--windows", eval_opts.windows, "Windows of --seq_len tokens (consecutive, from the start)")
      ->capture_default_str();
  eval->add_option("--seq_len", eval_opts.seq_len, "Tokens per window; each window is one forward pass from an "
                   "empty KV cache")->capture_default_str();
  eval->add_option("--json", eval_opts.json, "Also write the measurements to this JSON file");
  eval->add_option("--tokenizer", eval_opts.tokenizer, "tokenizer.json or its folder (default: beside --model)");
  eval->add_option("--accuracy_level", eval_opts.accuracy_level,
                   "ONNX Runtime session.qdq_matmulnbits_accuracy_level (1: fp32 compute; '' leaves ORT's default, "
                   "which quantizes activations to int8 in MatMulNBits)")->capture_default_str();
  eval->add_option("--threads", eval_opts.threads, "ONNX Runtime threads (0: its default)")->capture_default_str();
  eval->add_flag("--quiet", eval_opts.quiet, "No progress lines on stderr");
  return eval;
}

}  // namespace

// The edge where the flags given as names become the options' enums (one-line errors naming the flag),
// and the flags calibration shares with the run are copied into its options.
static void type_choices(const NamedChoices& c, nibble::QuantizeOptions& o) {
  o.algo = nibble::parse_algo(c.algo);
  o.arithmetic = nibble::parse_awq_mode(c.awq_mode);
  if (!c.format.empty()) o.format = nibble::parse_format(c.format);
  o.device = nibble::parse_device(c.device);
  if (!c.device_memory.empty()) o.device_memory = nibble::parse_size(c.device_memory, "--device_memory");
  if (!c.gather_quantize_axis.empty()) o.gather_quantize_axis = nibble::parse_gather_axis(c.gather_quantize_axis);
  if (!c.mixed_strategy.empty()) o.mixed_strategy_flag = nibble::parse_mixed_strategy(c.mixed_strategy);
  o.layer_by_layer = nibble::parse_layer_mode(c.layer_by_layer);
  o.calib.engine = nibble::parse_calibration_engine(c.calibration_engine);
  o.calib.threads = o.threads;
  o.calib.quiet = o.quiet;
}

namespace {

struct InspectArgs {
  std::string path;
  std::vector<std::string> exclude{"/lm_head"};
  int64_t block = 128;
  std::string gather_axis;
  int64_t gather_block = 32;
};

CLI::App* add_inspect_command(CLI::App& app, InspectArgs& a) {
  CLI::App* inspect = app.add_subcommand("inspect", "Show what would be quantized (weights, shapes, sizes)");
  inspect->add_option("model", a.path, "ONNX model")->required();
  inspect->add_option("--nodes_to_exclude", a.exclude, "As for quantize")->capture_default_str();
  inspect->add_option("--block_size", a.block, "As for quantize")->capture_default_str();
  inspect->add_option("--gather_quantize_axis", a.gather_axis, "As for quantize");
  inspect->add_option("--gather_block_size", a.gather_block, "As for quantize")->capture_default_str();
  return inspect;
}

struct SelftestArgs {
  std::string device = "auto";
  std::string memory;
};

CLI::App* add_selftest_command(CLI::App& app, SelftestArgs& a) {
  CLI::App* selftest = app.add_subcommand(
      "selftest", "Run every backend operation on generated data against the CPU reference; PASS/FAIL per operation");
  selftest->add_option("--device", a.device, "auto, cuda, cpu or cuda_emulated")->capture_default_str();
  selftest->add_option("--device_memory", a.memory, "As for quantize");
  return selftest;
}

CLI::App* add_forward_command(CLI::App& app, nibble::ForwardArgs& a, std::string& device) {
  CLI::App* fwd = app.add_subcommand(
      "forward", "Run the model's graph on nibble's own layer engine (no ONNX Runtime) and write chosen values; "
      "a check of the engine that calibration is moving to");
  fwd->add_option("--onnx_path", a.onnx_path, "The model")->required();
  fwd->add_option("--feeds", a.feeds, "Folder with index.json naming the graph inputs as raw arrays")->required();
  fwd->add_option("--values", a.values, "Names of the values to write (graph inputs, outputs or intermediates)")
      ->required()->delimiter(',');
  fwd->add_option("--out", a.out, "Folder the values and their index.json are written to")->required();
  fwd->add_option("--device", device, "cpu (the default), cuda or cuda_emulated: where the float operators run")
      ->capture_default_str();
  return fwd;
}

CLI::App* add_methods_command(CLI::App& app, bool& json) {
  CLI::App* methods = app.add_subcommand(
      "methods", "List the quantization methods (--algo): what each calibrates, whether --awq_mode modelopt runs "
                 "it, its default --format, and the output formats");
  methods->add_flag("--json", json, "JSON for programs (the Python API reads it)");
  return methods;
}

// CLI11's parse; the exit status when it ends the run (help, version, a bad flag or preset).
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::FileError& e) {  // --config: the message names the file
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 2;
  } catch (const CLI::ConfigError& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "nibble: error: %s (see nibble --help)\n", e.what());
    return 2;
  }
  return std::nullopt;
}

void drop_empty(std::vector<std::string>& v) { v.erase(std::remove(v.begin(), v.end(), std::string()), v.end()); }

int run_inspect_command(InspectArgs& a) {
  drop_empty(a.exclude);
  std::optional<int> gather_axis;
  if (!a.gather_axis.empty()) gather_axis = nibble::parse_gather_axis(a.gather_axis);
  return nibble::run_inspect(a.path, a.exclude, a.block, gather_axis, a.gather_block);
}

}  // namespace

int main(int argc, char** argv) {
  nibble::reexec_for_better_blas(argv);  // before anything else is done twice
  nibble::keep_freed_buffers_for_reuse();
  auto logger = spdlog::stderr_color_st("nibble");
  logger->set_pattern("[%T] %^%l%$ %v");
  spdlog::set_default_logger(logger);

  CLI::App app{"nibble: block-wise INT4/INT8 weight quantization of ONNX LLMs (ModelOpt-compatible flags)"};
  app.set_version_flag("--version", "nibble 0.1.0");
  app.require_subcommand(1);
  nibble::QuantizeOptions opts;
  CLI::App* quant = app.add_subcommand("quantize", "Quantize the MatMul/Gemm weights of an ONNX model");
  // Added first, so that its callback (which applies the file) runs before every other flag's.
  quant->add_option_function<std::string>(
      "--config",
      [&](const std::string& path) {
        opts.config = path;
        apply_config(*quant, path);
      },
      "Read flags from a TOML/INI preset (configs/*.toml: key = value, keys are the flag names without "
      "'--'); flags given on the command line win");
  NamedChoices choices;
  add_quantize_flags(*quant, opts, choices);
  InspectArgs inspect_args;
  add_inspect_command(app, inspect_args);
  nibble::EvalOptions eval_opts;
  CLI::App* eval = add_eval_command(app, eval_opts);
  SelftestArgs selftest_args;
  CLI::App* selftest = add_selftest_command(app, selftest_args);
  bool methods_json = false;
  CLI::App* methods = add_methods_command(app, methods_json);
  nibble::ForwardArgs forward_args;
  std::string forward_device = "cpu";
  CLI::App* fwd = add_forward_command(app, forward_args, forward_device);
  if (const std::optional<int> status = parse_command_line(app, argc, argv)) return *status;

  try {
    if (*quant) {
      drop_empty(opts.nodes_to_exclude);
      type_choices(choices, opts);
      opts.calib.calibration_eps_given = quant->get_option("--calibration_eps")->count() > 0;
      if (opts.quiet) spdlog::set_level(spdlog::level::warn);
      if (opts.verbose) spdlog::set_level(spdlog::level::debug);
      return nibble::run_quantize(opts);
    }
    if (*eval) return nibble::run_eval(eval_opts);
    if (*methods) return nibble::run_methods(methods_json);
    if (*fwd) {
      forward_args.device = nibble::parse_device(forward_device);
      return nibble::run_forward(forward_args);
    }
    if (*selftest) {
      const uint64_t memory =
          selftest_args.memory.empty() ? 0 : nibble::parse_size(selftest_args.memory, "--device_memory");
      return nibble::run_selftest(nibble::parse_device(selftest_args.device), memory);
    }
    return run_inspect_command(inspect_args);
  } catch (const nibble::Error& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "nibble: error: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
  }
  return 1;
}

#include "host/pipeline.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "host/awq.h"
#include "host/awq_clip.h"
#include "host/calibration.h"
#include "host/mixed_precision.h"
#include "host/opset.h"
#include "host/plan.h"
#include "host/progress.h"
#include "host/report.h"
#include "host/rewrite.h"
#include "kernels/backend.h"
#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"
#include "loaders/error.h"
#include "loaders/genai_folder.h"
#include "loaders/model_writer.h"
#include "loaders/onnx_model.h"

namespace nibble {

Format QuantizeOptions::resolved_format() const {
  if (format == "qdq") return Format::kQdq;
  if (format == "matmulnbits") return Format::kMatMulNBits;
  if (format == "dq") return Format::kDq;
  return algo == "rtn" ? Format::kQdq : Format::kDq;
}

namespace {

const char* format_name(Format f) {
  switch (f) {
    case Format::kDq: return "dq";
    case Format::kQdq: return "qdq";
    default: return "matmulnbits";
  }
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss) * 1024;
}

std::string shape_str(const PlannedWeight& pw) {
  return "[" + std::to_string(pw.rows) + ", " + std::to_string(pw.cols) + "]";
}

// A kernel producing NaN/Inf scales means the weight itself holds NaN/Inf: say where.
void validate_result(const PlannedWeight& pw, const kernels::QuantResult& q) {
  if (!std::isfinite(q.sq_error))
    throw Error("weight '" + pw.weight + "' holds NaN or Inf values: it cannot be quantized");
  for (size_t i = 0; i < q.scales.size(); ++i)
    if (!std::isfinite(q.scales[i]))
      throw Error("weight '" + pw.weight + "': block " + std::to_string(i) +
                  " has a non-finite scale (the weight holds NaN or Inf values)");
}

// Flags ModelOpt's command line has that change nothing in this configuration: one line each.
void warn_inert_flags(const QuantizeOptions& o) {
  const bool lite = o.algo == "awq_lite" || o.algo == "awq_full";
  const bool clip = o.algo == "awq_clip" || o.algo == "awq_full";
  if (o.gather_block_size != 32)
    spdlog::warn("--gather_block_size {}: no effect: Gather (embedding) quantization is not implemented, "
                 "embeddings stay float", o.gather_block_size);
  if (lite && o.awq_mode == "modelopt" && !o.awqlite_run_per_subgraph && o.awqlite_alpha_step != 0.1)
    spdlog::warn("--awqlite_alpha_step {}: no effect with --awq_mode modelopt: ModelOpt's per-node search uses "
                 "its fixed grid 0, 0.1, ..., 1 (--awq_mode nibble and --awqlite_run_per_subgraph honour it)",
                 o.awqlite_alpha_step);
  if (clip && o.awq_mode == "nibble" && o.awqclip_bsz_col != 1024)
    spdlog::warn("--awqclip_bsz_col {}: no effect with --awq_mode nibble: its clip search works on the Gram "
                 "matrix, with no column chunks", o.awqclip_bsz_col);
  if (!lite && !clip && !mixed_needs_calibration(o))
    for (const auto& [on, flag] : {std::pair{o.use_random_calib, "--use_random_calib"},
                                   {o.add_position_ids, "--add_position_ids"},
                                   {o.no_position_ids, "--no_position_ids"}})
      if (on) spdlog::warn("{}: no effect: --algo {} runs no calibration", flag, o.algo);
}

}  // namespace

void validate_options(const QuantizeOptions& o) {
  static const std::vector<std::string> algos = {"awq_lite", "awq_clip", "awq_full", "rtn", "rtn_dq"};
  if (std::find(algos.begin(), algos.end(), o.algo) == algos.end())
    throw Error("--algo " + o.algo + " is unknown (choose awq_lite, awq_clip, awq_full, rtn or rtn_dq)");
  if (!(o.awqclip_alpha_step > 0 && o.awqclip_alpha_step <= 1)) throw Error("--awqclip_alpha_step must be in (0, 1]");
  if (!(o.awqclip_alpha_min > 0 && o.awqclip_alpha_min <= 1)) throw Error("--awqclip_alpha_min must be in (0, 1]");
  if (o.awqclip_bsz_col < 1) throw Error("--awqclip_bsz_col must be at least 1");
  if (o.awq_mode != "nibble" && o.awq_mode != "modelopt")
    throw Error("--awq_mode " + o.awq_mode + " is unknown (choose nibble or modelopt)");
  if (o.awqlite_alpha_step <= 0 || o.awqlite_alpha_step > 1)
    throw Error("--awqlite_alpha_step must be in (0, 1]");
  if (o.calib_size < 1) throw Error("--calib_size must be at least 1");
  if (o.batch_size < 1) throw Error("--batch_size must be at least 1");
  if (o.calib_seq_len < 1) throw Error("--calib_seq_len must be at least 1");
  if (!o.format.empty() && o.format != "dq" && o.format != "qdq" && o.format != "matmulnbits")
    throw Error("--format " + o.format + " is unknown (choose dq, qdq or matmulnbits)");
  const int64_t b = o.block_size;
  if (b != -1 && (b < 16 || (b & (b - 1)) != 0))
    throw Error("--block_size " + std::to_string(b) + " must be a power of two >= 16, or -1 for per-channel");
  validate_mixed_options(o);
  if (o.awqlite_run_per_subgraph && o.awq_mode == "modelopt" && o.algo == "awq_full")
    throw Error("--awqlite_run_per_subgraph with --algo awq_full --awq_mode modelopt: ModelOpt refuses the "
                "per-subgraph search with the clip search (use --awq_mode nibble)");
  if (o.awqlite_run_per_subgraph && o.awq_mode == "modelopt" && mixed_enabled(o) &&
      (o.algo == "awq_lite" || o.algo == "awq_full"))
    throw Error("--awqlite_run_per_subgraph --awq_mode modelopt: ModelOpt refuses the per-subgraph search with "
                "mixed precision (use --awq_mode nibble)");
  if (!o.gather_quantize_axis.empty())
    throw Error("--gather_quantize_axis is not implemented yet (embeddings stay float)");
  if (o.use_column_major) throw Error("--use_column_major is not implemented yet");
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    throw Error("--device " + o.device + " is unknown (choose auto, cuda or cpu)");
  if (o.threads < 0) throw Error("--threads must be >= 0");
  if (o.onnx_path.empty()) throw Error("--onnx_path is required");
  if (o.output_path.empty()) throw Error("--output_path is required");
}

int run_quantize(const QuantizeOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  validate_options(o);
  warn_inert_flags(o);
  kernels::set_num_threads(o.threads);
  std::string why;
  auto backend = kernels::make_backend(
      o.device == "cpu" ? kernels::Device::kCpu : o.device == "cuda" ? kernels::Device::kCuda : kernels::Device::kAuto,
      &why);

  auto model = OnnxModel::load(o.onnx_path);
  const std::vector<std::string> inputs = model->input_files();  // checks every location
  // Check every external range now, before anything is written (views are only maps).
  for (const auto& t : model->proto().graph().initializer())
    if (t.data_location() == onnx::TensorProto::EXTERNAL) model->view(t);

  PlanOptions popt;
  popt.nodes_to_exclude = o.nodes_to_exclude;
  popt.block_size = o.block_size;
  Plan plan = make_plan(*model, popt);
  if (plan.weights.empty())
    throw Error("nothing to quantize in " + o.onnx_path +
                ": no MatMul/Gemm with a constant 2-D float weight (" + std::to_string(plan.skipped.size()) +
                " skipped; see `nibble inspect`)");
  for (const auto& s : plan.skipped) spdlog::debug("skip {} ({}): {}", s.node, s.op_type, s.reason);
  MixedOutcome mixed;  // INT8 layers (issue 9): static strategies now, sensitivity after calibration
  const bool sensitivity = mixed_needs_calibration(o);  // measured on the calibration data
  if (mixed_enabled(o) && !sensitivity) apply_static_mixed(*model, plan, o, &mixed);

  const Format format = o.resolved_format();
  // Opset problems must surface before any work: matmulnbits may fall back to dq for a Gemm.
  if (GraphRewriter::format_needs_opset21(format)) {
    onnx::ModelProto probe;
    probe.mutable_opset_import()->CopyFrom(model->proto().opset_import());
    *probe.mutable_graph()->mutable_node() = model->proto().graph().node();
    raise_default_opset(probe, 21);
  }

  if (!genai_companion_files(o.onnx_path).empty() && !o.force) {
    namespace fs = std::filesystem;
    const auto out_dir = fs::absolute(o.output_path).parent_path();
    std::error_code ec;
    if (fs::weakly_canonical(out_dir, ec) != fs::path(model->dir()) &&
        fs::exists(out_dir / "genai_config.json", ec))
      throw Error("output folder " + out_dir.string() + " already has genai_config.json (use --force to overwrite)");
  }

  const bool awq = o.algo == "awq_lite" || o.algo == "awq_full";
  const bool clip = o.algo == "awq_clip" || o.algo == "awq_full";  // host/awq_clip.h
  const bool modelopt_mode = o.awq_mode == "modelopt";
  std::map<std::string, AwqChoice> choices, per_node;
  std::unique_ptr<Calibration> calib;
  std::unique_ptr<ClipSearch> clipper;
  if (awq || clip || sensitivity) {
    if (!o.force) {  // fail before minutes of calibration, not after
      std::error_code ec;
      if (std::filesystem::exists(o.output_path, ec))
        throw Error("output " + o.output_path + " exists (use --force to overwrite)");
    }
    std::vector<Calibration::Request> acts;
    for (const auto& [act, idx] : plan.siblings) acts.push_back({act, plan.weights[idx[0]].K()});
    const auto tc = clock::now();
    calib = Calibration::run(o, model->path(), acts, /*mask_padding=*/!modelopt_mode, clip_calibration(o, plan));
    spdlog::info("calibration: {} tokens, {} activations, {:.1f} s", calib->tokens(), acts.size(),
                 std::chrono::duration<double>(clock::now() - tc).count());
    const auto ts = clock::now();
    if (awq && clip && modelopt_mode) awq_full_modelopt_scales(*model, plan, *calib, o, &per_node, &choices);
    else if (awq) choices = awq_lite_search(*model, plan, *calib, o, modelopt_mode);
    if (awq)
      spdlog::info("awq-lite search ({} mode): {:.1f} s", o.awq_mode,
                   std::chrono::duration<double>(clock::now() - ts).count());
    if (sensitivity)
      apply_sensitivity_mixed(*model, plan, *calib, o, format, awq ? &choices : nullptr, &mixed);
    if (clip) {
      const auto tk = clock::now();
      clipper = std::make_unique<ClipSearch>(o, *calib, modelopt_mode);
      if (modelopt_mode) clipper->search_modelopt(*model, plan, awq ? &per_node : nullptr);
      spdlog::info("clip search ({} mode): {:.1f} s{}", o.awq_mode,
                   std::chrono::duration<double>(clock::now() - tk).count(),
                   modelopt_mode ? "" : " (searched while quantizing)");
    }
  }

  ModelWriter::Options wopt;
  wopt.force = o.force;
  wopt.protected_paths = inputs;
  ModelWriter writer(o.output_path, wopt);
  GraphRewriter rewriter(model->proto(), format, writer);
  // Logged only now: bad input fails above with its one error line and nothing else.
  spdlog::info("{} ({} threads; OpenBLAS {})", why, kernels::num_threads(), kernels::blas_core_name());

  uint64_t total_in = 0;
  for (const auto& pw : plan.weights) total_in += uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype);
  int64_t n_int8 = 0;
  for (const auto& pw : plan.weights) n_int8 += pw.bits == 8;
  spdlog::info("quantizing {} weights ({}) of {}: {} INT4 block {}{} -> {}", plan.weights.size(),
               human_bytes(total_in), o.onnx_path, o.algo, o.block_size,
               n_int8 ? " + " + std::to_string(n_int8) + " INT8 per channel" : std::string(), format_name(format));
  const bool zero_point = o.use_zero_point && !(clip && !awq && modelopt_mode);  // ModelOpt's awq_clip: INT4
  std::map<std::string, std::vector<float>> column_divisors;
  if (awq) column_divisors = place_awq_scales(*model, plan, choices, rewriter, !o.awqlite_disable_fuse_nodes);

  nlohmann::json weights = nlohmann::json::array();
  Progress progress(int64_t(plan.weights.size()), total_in, !o.quiet);
  uint64_t quant_out = 0;
  double sq_err_total = 0;
  int64_t elems_total = 0;
  for (const auto& pw : plan.weights) {
    const auto tw = clock::now();
    TensorView v = model->view(*model->initializer(pw.weight));
    kernels::WeightMatrix w;
    w.dtype = pw.dtype;
    w.data = v.data;
    w.rows = pw.rows;
    w.cols = pw.cols;
    w.k_axis = pw.k_axis;
    kernels::QuantSpec spec;
    spec.bits = pw.bits;
    spec.block = pw.resolved_block();
    spec.zero_point = zero_point;
    // AWQ: quantize W ⊙ s (after dividing the columns by a consumer's 1/s folded into this weight).
    std::vector<uint8_t> prepared;
    if (awq) {
      auto cd = column_divisors.find(pw.weight);
      if (cd != column_divisors.end()) {
        prepared.resize(uint64_t(pw.rows * pw.cols) * dtype_size(pw.dtype));
        const int64_t N = pw.N(), K = pw.K();
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) {
            const size_t i = size_t(pw.k_axis == 0 ? k * N + n : n * K + k);
            store_float(pw.dtype, prepared.data(), i,
                        round_to(pw.dtype, load_float(pw.dtype, v.data, i) / round_to(pw.dtype, cd->second[size_t(n)])));
          }
        w.data = prepared.data();
      }
      if (modelopt_mode) {
        prepared = kernels::scale_weight(w, choices.at(pw.weight).scale.data());
      } else {  // nibble: W ⊙ s in fp32, scales rounded to the weight dtype
        prepared = kernels::scale_weight_f32(w, choices.at(pw.weight).scale.data());
        w.dtype = DType::kFloat32;
        spec.scale_dtype = pw.dtype;
      }
      w.data = prepared.data();
    }
    kernels::QuantResult q;
    if (clip) {
      clipper->quantize(pw, w, spec, awq ? &choices.at(pw.weight).scale : nullptr, q);
    } else if (awq && !modelopt_mode) {
      // nibble mode: each block picks its clip ratio by the activation-weighted error, the
      // weight of input channel k being diag(XᵀX)[k] / s[k]^2 (its energy after X ⊘ s).
      const kernels::ActivationStats st = calib->stats(pw.activation, false);
      const auto& sc = choices.at(pw.weight).scale;
      std::vector<float> energy(size_t(pw.K()));
      for (int64_t k = 0; k < pw.K(); ++k)
        energy[size_t(k)] = float(st.gram[k * st.K + k] / (double(sc[size_t(k)]) * double(sc[size_t(k)])));
      kernels::rtn_quantize_weighted_fast(w, spec, energy.data(), block_clip_ratios(), q);
    } else {
      backend->rtn(w, spec, q);
    }
    validate_result(pw, q);
    uint64_t bytes = 0;
    const Format used = rewriter.emit(pw, spec, q, &bytes);
    if (used != format)
      spdlog::warn("{}: {} cannot be expressed as MatMulNBits (transA, alpha/beta or bias shape); wrote dq instead",
                   pw.weight, pw.node_name);
    if (!pw.keep_float) model->release(v);
    quant_out += bytes;
    const int64_t n = pw.rows * pw.cols;
    sq_err_total += q.sq_error;
    elems_total += n;
    const double secs = std::chrono::duration<double>(clock::now() - tw).count();
    weights.push_back({{"name", pw.weight},
                       {"node", pw.node_name},
                       {"nodes", pw.nodes.size()},
                       {"op_type", pw.op_type},
                       {"shape", {pw.rows, pw.cols}},
                       {"k_axis", pw.k_axis},
                       {"dtype", dtype_name(pw.dtype)},
                       {"layer", pw.layer},
                       {"role", pw.role},
                       {"bits", pw.bits},
                       {"block_size", pw.block},
                       {"zero_point", spec.zero_point},
                       {"format", format_name(used)},
                       {"mse", q.sq_error / double(n)},
                       {"bytes_in", uint64_t(n) * dtype_size(pw.dtype)},
                       {"bytes_out", bytes},
                       {"seconds", secs}});
    if (mixed.per_weight.count(pw.weight)) weights.back()["mixed"] = mixed.per_weight.at(pw.weight);
    if (awq) {
      const AwqChoice& c = choices.at(pw.weight);
      weights.back()["awq_alpha"] = c.alpha;
      weights.back()["awq_losses"] = c.losses;
    }
    progress.step(pw.weight + " " + shape_str(pw) + " " + dtype_name(pw.dtype) + " -> int" + std::to_string(pw.bits) +
                      " " + human_bytes(uint64_t(n) * dtype_size(pw.dtype)) + " -> " + human_bytes(bytes),
                  uint64_t(n) * dtype_size(pw.dtype));
  }
  progress.finish();

  // Everything else is copied through unchanged (streamed from the map, pages dropped after).
  uint64_t copied = 0;
  for (auto& t : *model->proto().mutable_graph()->mutable_initializer()) {
    if (rewriter.removed_initializers().count(t.name()) || rewriter.written_initializers().count(t.name())) continue;
    const bool external = t.data_location() == onnx::TensorProto::EXTERNAL;
    if (!external && t.raw_data().size() < ModelWriter::kInlineThreshold) continue;
    TensorView v = model->view(t);  // checks the range
    if (external) writer.put_from_file(t, model->external_path(v), v.ref.offset, v.nbytes);
    else writer.put(t, v.data, v.nbytes);
    copied += v.nbytes;
  }
  rewriter.finish();
  auto* meta = model->proto().add_metadata_props();
  meta->set_key("nibble.quantization");
  meta->set_value("algo=" + o.algo + " format=" + format_name(format) + " block_size=" + std::to_string(o.block_size) +
                  " zero_point=" + (zero_point ? "1" : "0") +
                  (mixed.strategy.empty() ? "" : " mixed=" + mixed.strategy + " int8=" + std::to_string(n_int8)));
  writer.commit(model->proto());
  const auto companions = copy_genai_companions(model->path(), writer.out_path(), o.force);

  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  const uint64_t out_bytes = writer.data_bytes() + uint64_t(model->proto().ByteSizeLong());
  if (!o.quiet) {
    spdlog::info("wrote {} ({} graph + {} data){}", writer.out_path(), human_bytes(model->proto().ByteSizeLong()),
                 human_bytes(writer.data_bytes()),
                 companions.empty() ? "" : " and " + std::to_string(companions.size()) + " GenAI/tokenizer files");
    spdlog::info("{} weights: {} -> {} ({:.2f} bits/weight), {} copied unchanged, rms error {:.3g}; "
                 "{:.2f} s, peak RSS {}",
                 plan.weights.size(), human_bytes(total_in), human_bytes(quant_out),
                 elems_total ? 8.0 * double(quant_out) / double(elems_total) : 0.0, human_bytes(copied),
                 std::sqrt(sq_err_total / double(elems_total)), secs, human_bytes(peak_rss_bytes()));
  }
  if (!o.report.empty()) {
    nlohmann::json skipped = nlohmann::json::array();
    for (const auto& s : plan.skipped) skipped.push_back({{"node", s.node}, {"op_type", s.op_type}, {"reason", s.reason}});
    nlohmann::json report = {
        {"tool", "nibble"},
        {"options", options_to_json(o)},
        {"backend", backend->name()},
        {"weights", weights},
        {"skipped", skipped},
        {"summary",
         {{"weights_quantized", plan.weights.size()},
          {"bytes_in", total_in},
          {"bytes_quantized_out", quant_out},
          {"bytes_copied", copied},
          {"output_bytes", out_bytes},
          {"mse", sq_err_total / double(elems_total)},
          {"seconds", secs},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"genai_files", companions}}}};
    if (!mixed.strategy.empty()) report["summary"]["mixed"] = mixed.summary;
    write_json_file(o.report, report);
  }
  return 0;
}

}  // namespace nibble

// commit and report (host/run/stages.h).
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cmath>

#include "calib/capture_server.h"
#include "calib/engine_calibration.h"
#include "host/algo/layer_learned.h"
#include "host/algo/learned_rounding.h"
#include "host/methods.h"
#include "host/run/progress.h"
#include "host/run/report.h"
#include "host/run/stages.h"
#include "loaders/durable.h"
#include "loaders/genai_folder.h"

namespace nibble {
namespace {

// Where the layer engine's calibration time went: the forward pass and the statistics, the products
// among them (FLOPs and seconds) and their rate over the whole engine time; what the engine spends
// beyond its products is the rest.
nlohmann::json layer_engine_json(const EngineCalibration& e) {
  const auto f = e.forward_products(), s = e.statistics_products();
  const double seconds = e.forward_seconds() + e.statistics_seconds();
  const double flop = f.flop + s.flop;
  return {{"engine", "native"},
          {"forward_seconds", e.forward_seconds()},
          {"statistics_seconds", e.statistics_seconds()},
          {"forward_gflop", f.flop * 1e-9},
          {"statistics_gflop", s.flop * 1e-9},
          {"product_seconds", f.seconds + s.seconds},
          {"forward_product_seconds", f.seconds},
          {"statistics_product_seconds", s.seconds},
          {"statistics_row_bytes", e.statistics_row_bytes()},
          {"forward_on_device", e.forward_on_device()},
          {"activation_upload_bytes", e.activation_upload_bytes()},
          {"host_operators", e.host_operators()},
          {"gflops", seconds > 0 ? flop * 1e-9 / seconds : 0.0},
          {"cpu_seconds", e.cpu_seconds()},
          {"gflop_per_cpu_second", e.cpu_seconds() > 0 ? flop * 1e-9 / e.cpu_seconds() : 0.0}};
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return uint64_t(ru.ru_maxrss) * 1024;
}

}  // namespace

Committed commit_stage(const QuantizeOptions& o, OnnxModel& model, const Planned& planned, const Emitted& emitted,
                       GraphRewriter& rewriter, ModelWriter& writer) {
  rewriter.finish();
  int64_t n_int8 = 0;
  for (const auto& pw : planned.plan.weights) n_int8 += pw.bits == 8;
  auto* meta = model.proto().add_metadata_props();
  meta->set_key("nibble.quantization");
  meta->set_value(std::string("algo=") + name_of(o.algo) + " format=" + name_of(planned.format) +
                  " block_size=" + std::to_string(o.block_size) + " zero_point=" + (emitted.zero_point ? "1" : "0") +
                  (planned.mixed.strategy.empty()
                       ? ""
                       : " mixed=" + planned.mixed.strategy + " int8=" + std::to_string(n_int8)) +
                  (planned.plan.gathers.empty()
                       ? ""
                       : " gather_quantize_axis=" + std::to_string(*o.gather_quantize_axis) +
                             " gather_block_size=" + std::to_string(o.gather_block_size)));
  writer.commit(model.proto());
  Committed c;
  c.companions = copy_genai_companions(model.path(), writer.out_path(), o.force);
  c.output_bytes = writer.data_bytes() + uint64_t(model.proto().ByteSizeLong());
  if (!o.quiet)
    spdlog::info("wrote {} ({} graph + {} data){}", writer.out_path(), human_bytes(model.proto().ByteSizeLong()),
                 human_bytes(writer.data_bytes()),
                 c.companions.empty() ? "" : " and " + std::to_string(c.companions.size()) + " GenAI/tokenizer files");
  return c;
}

// Where the run's time went, by stage (a layer-by-layer run's calibration, search and quantization are
// all in `layers`, and also given apart: the parts of `layers`).
nlohmann::json stage_seconds_json(const QuantizeOptions& o, const StageSeconds& t) {
  nlohmann::json j = {{"load", t.load}, {"write", t.write}};
  if (t.layers > 0) j["layers"] = t.layers;
  j["quantize"] = t.quantize;
  if (needs_calibration(o)) {
    j["calibrate"] = t.calibrate;
    j["search"] = t.search;
  }
  return j;
}

void report_stage(const QuantizeOptions& o, const Planned& planned, const Emitted& e, const Committed& c,
                  uint64_t copied, const StageSeconds& t, const kernels::Backend& backend,
                  const nlohmann::json& layer_pass) {
  const double secs = t.total;
  const size_t nw = planned.plan.weights.size(), ng = planned.plan.gathers.size();
  if (!o.quiet)
    spdlog::info("{} weights{}: {} -> {} ({:.2f} bits/weight), {} copied unchanged, rms error {:.3g}; "
                 "{:.2f} s, peak RSS {}",
                 nw, ng ? " + " + std::to_string(ng) + " embedding(s)" : "", human_bytes(e.bytes_in), human_bytes(e.bytes_out),
                 e.elements ? 8.0 * double(e.bytes_out) / double(e.elements) : 0.0, human_bytes(copied),
                 std::sqrt(e.sq_error / double(e.elements)), secs, human_bytes(peak_rss_bytes()));
  if (const kernels::DeviceMemoryUse m = backend.device_memory(); m.budget > 0 && !o.quiet)
    spdlog::info("{}: peak device memory {} of a {} budget", backend.name(), human_bytes(m.peak), human_bytes(m.budget));
  if (o.report.empty()) return;
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& s : planned.plan.skipped)
    skipped.push_back({{"node", s.node}, {"op_type", s.op_type}, {"reason", s.reason}});
  // Who ran each stage: calibration is ONNX Runtime in calib/capture.py, or the layer engine, whose forward
  // runs on a device backend (the CPU's own operators on the CPU) and whose statistics build up on the
  // backend; the array work is the backend's.
  const kernels::TransferLedger* ledger = backend.transfer_ledger();
  nlohmann::json stages = {{"quantize", backend.name()}, {"pack", backend.name()}};
  if (needs_calibration(o)) {
    stages["calibrate"] = o.calib.layer_engine
                              ? "nibble layer engine (forward: " + std::string(ledger ? backend.name() : "cpu") +
                                    ", statistics: " + backend.name() + ")"
                              : "onnxruntime (" + o.calib.calibration_eps + ")";
    stages["search"] = backend.name();
  }
  nlohmann::json report = {{"tool", "nibble"},
                           {"options", options_to_json(o)},
                           {"backend", backend.name()},
                           {"stages", stages},
                           {"weights", e.weights},
                           {"skipped", skipped},
                           {"summary",
                            {{"weights_quantized", nw},
                             {"embeddings_quantized", ng},
                             {"bytes_in", e.bytes_in},
                             {"bytes_quantized_out", e.bytes_out},
                             {"bytes_copied", copied},
                             {"output_bytes", c.output_bytes},
                             {"mse", e.sq_error / double(e.elements)},
                             {"seconds", secs},
                             {"fsync_seconds", fsync_seconds()},
                             {"calibration_processes", capture_processes_started()},
                             {"peak_rss_bytes", peak_rss_bytes()},
                             {"genai_files", c.companions},
                             {"layer_pass", layer_pass}}}};
  report["summary"]["stage_seconds"] = stage_seconds_json(o, t);
  if (o.calib.layer_engine) report["summary"]["calibration_engine"] = layer_engine_json(*o.calib.layer_engine);
  else if (needs_calibration(o))
    report["summary"]["calibration_engine"] = {{"engine", "ort"},
        {"why", o.calib.engine_fallback.empty() ? std::string("--calibration_engine ort") : o.calib.engine_fallback}};
  // How fast the weights came from their files, and how long the quantizer waited for them: where the
  // reads are what bounds a run, these say so. Copied (a device): bytes over the reads' wall time. Read
  // from the map by the kernels (the CPU): bytes over the quantize stage's, which reads them as it goes.
  report["summary"]["read_gbps"] =
      e.read.mapped ? (t.quantize > 0 ? double(e.read.bytes) / t.quantize / 1e9 : 0.0) : e.read.gbps();
  report["summary"]["read"] = {{"how", e.read.mapped ? "map" : "copy"}, {"bytes", e.read.bytes},
                               {"tensors", e.read.tensors},            {"seconds", e.read.seconds},
                               {"wait_seconds", e.read.wait_seconds},  {"threads", e.read.threads}};
  if (!planned.mixed.strategy.empty()) report["summary"]["mixed"] = planned.mixed.summary;
  if (method(o.algo).learned_rounding || (o.learns_layers_from_gptq() && o.learned_layer_sweeps)) {
    const LearnedRoundingTotals l = learned_rounding_totals();
    report["summary"]["learned_rounding"] = {{"objective_gptq", l.objective_gptq},
                                             {"objective_learned", l.objective_learned},
                                             {"codes_moved", l.codes_moved},
                                             {"weights", l.weights},
                                             {"seconds", l.seconds}};
  }
  if (method(o.algo).learns_layers) report["summary"]["layer_learning"] = layer_learning_summary();
  if (ledger) report["summary"]["device"] = ledger_to_json(*ledger);
  if (const kernels::DeviceMemoryUse m = backend.device_memory(); m.budget > 0) {
    report["summary"]["device_memory_budget_bytes"] = m.budget;
    report["summary"]["peak_device_memory_bytes"] = m.peak;
  }
  write_json_file(o.report, report);
}

}  // namespace nibble

#include "host/run/report.h"

#include <filesystem>
#include <fstream>

#include "host/methods.h"
#include "loaders/durable.h"
#include "loaders/error.h"

namespace nibble {
namespace {

// The flags every run has (the methods' own are method_flags()).
nlohmann::json fixed_options_to_json(const QuantizeOptions& o) {
  return {// ModelOpt's flags
          {"onnx_path", o.onnx_path},
          {"output_path", o.output_path},
          {"algo", name_of(o.algo)},
          {"block_size", o.block_size},
          {"use_zero_point", o.zero_point_flag},
          {"awqlite_alpha_step", o.awqlite_alpha_step},
          {"awqlite_run_per_subgraph", o.awqlite_run_per_subgraph},
          {"awqlite_disable_fuse_nodes", o.awqlite_disable_fuse_nodes},
          {"awqclip_alpha_step", o.awqclip_alpha_step},
          {"awqclip_alpha_min", o.awqclip_alpha_min},
          {"awqclip_bsz_col", o.awqclip_bsz_col},
          {"calibration_eps", o.calib.calibration_eps},
          {"calibration_engine", name_of(o.calib.engine)},
          {"calib_size", o.calib.calib_size},
          {"dataset", o.calib.dataset},
          {"batch_size", o.calib.batch_size},
          {"no_position_ids", o.calib.no_position_ids},
          {"add_position_ids", o.calib.add_position_ids},
          {"no_past_kv_inputs", o.calib.no_past_kv_inputs},
          {"use_buffer_share", o.calib.use_buffer_share},
          {"use_fp32", o.calib.use_fp32},
          {"use_random_calib", o.calib.use_random_calib},
          {"enable_mixed_quant", o.enable_mixed_quant},
          {"layers_8bit", o.layers_8bit},
          {"gather_quantize_axis", o.gather_quantize_axis ? nlohmann::json(*o.gather_quantize_axis) : nlohmann::json()},
          {"gather_block_size", o.gather_block_size},
          {"use_column_major", o.use_column_major},
          {"nodes_to_exclude", o.nodes_to_exclude},
          {"model_name", o.calib.model_name},
          // nibble's own
          {"calib_data", o.calib.calib_data},
          {"calib_seq_len", o.calib.calib_seq_len},
          {"calib_cache", o.calib.calib_cache},
          {"mixed_strategy", name_of(o.mixed_strategy_flag)},
          {"mixed_budget", o.mixed_budget},
          {"awq_mode", name_of(o.arithmetic)},
          {"device", name_of(o.device)},
          {"device_memory", o.device_memory},
          {"format", o.format ? name_of(*o.format) : ""},
          {"threads", o.threads},
          {"force", o.force},
          {"layer_by_layer", name_of(o.layer_by_layer)},
          {"resume", o.resume},
          {"feed_quantized", o.feed_quantized},
          {"calibrate_first", o.calibrate_first},
          {"report", o.report},
          {"config", o.config},
          {"quiet", o.quiet},
          {"verbose", o.verbose}};
}

}  // namespace

nlohmann::json options_to_json(const QuantizeOptions& o) {
  // Every field of QuantizeOptions, under its flag's name (tests/e2e/test_config.py checks that each
  // flag of `nibble quantize --help` is here). Empty strings are "not given" (format: chosen by algo).
  nlohmann::json j = fixed_options_to_json(o);
  for (const MethodFlag& f : method_flags()) j[f.name] = flag_value(f, o);  // the methods' own
  return j;
}

nlohmann::json ledger_to_json(const kernels::TransferLedger& l) {
  // The operations that ran on the host: the report's stages name the backend, and would otherwise
  // claim the device did all the work.
  nlohmann::json ops = nlohmann::json::object(), on_host = nlohmann::json::array();
  for (const auto& [name, t] : l.ops)
    if (t.host_fallback) on_host.push_back(name);
  // How the copies went (pinned staging, prefetches ahead of use): beside the counts of bytes.
  const auto copies = [](const kernels::OpTransfers& t) {
    return nlohmann::json{{"staged_bytes", t.staged_bytes},
                          {"staging_chunks", t.staging_chunks},
                          {"prefetches", t.prefetches},
                          {"prefetch_bytes", t.prefetch_bytes},
                          {"prefetches_overlapped", t.prefetches_overlapped},
                          {"prefetch_bytes_overlapped", t.prefetch_bytes_overlapped},
                          {"uploads_in_flight", t.uploads_in_flight}};
  };
  for (const auto& [name, t] : l.ops) {
    ops[name] = {{"calls", t.calls},       {"h2d_bytes", t.h2d_bytes}, {"d2h_bytes", t.d2h_bytes},
                 {"allocations", t.allocations}, {"launches", t.launches}, {"flops", t.flops},
                 {"flops_fp64", t.flops_fp64},     {"host_fallback", t.host_fallback}};
    ops[name].update(copies(t));
  }
  nlohmann::json total = {{"h2d_bytes", l.total.h2d_bytes}, {"d2h_bytes", l.total.d2h_bytes},
                          {"allocations", l.total.allocations}, {"launches", l.total.launches},
                          {"flops", l.total.flops}, {"flops_fp64", l.total.flops_fp64},
                          {"host_fallback", l.total.host_fallback}, {"on_host", on_host}, {"ops", ops}};
  total.update(copies(l.total));
  return total;
}

void write_json_file(const std::string& path, const nlohmann::json& report) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::absolute(path);
  // Not a file (/dev/null, /dev/stdout, a pipe): written in place. Renaming a temporary over it would
  // replace the device node itself when run as root.
  if (fs::exists(p, ec) && !fs::is_regular_file(p, ec) && !fs::is_directory(p, ec)) {
    std::ofstream f(p);
    if (!(f << report.dump(2) << "\n")) throw Error("cannot write report " + p.string());
    return;
  }
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  // A checkpoint must survive a crash of the machine whole, as the old one or the new one.
  write_file_durably(p.string(), report.dump(2) + "\n");
}

}  // namespace nibble

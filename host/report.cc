#include "host/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loaders/error.h"

namespace nibble {

nlohmann::json options_to_json(const QuantizeOptions& o) {
  return {{"onnx_path", o.onnx_path},
          {"output_path", o.output_path},
          {"algo", o.algo},
          {"format", o.format},
          {"block_size", o.block_size},
          {"use_zero_point", o.use_zero_point},
          {"awqlite_alpha_step", o.awqlite_alpha_step},
          {"awqlite_run_per_subgraph", o.awqlite_run_per_subgraph},
          {"awqlite_disable_fuse_nodes", o.awqlite_disable_fuse_nodes},
          {"awqclip_alpha_step", o.awqclip_alpha_step},
          {"awqclip_alpha_min", o.awqclip_alpha_min},
          {"awqclip_bsz_col", o.awqclip_bsz_col},
          {"calibration_eps", o.calibration_eps},
          {"calib_size", o.calib_size},
          {"dataset", o.dataset},
          {"batch_size", o.batch_size},
          {"enable_mixed_quant", o.enable_mixed_quant},
          {"layers_8bit", o.layers_8bit},
          {"mixed_strategy", o.mixed_strategy},
          {"mixed_budget", o.mixed_budget},
          {"nodes_to_exclude", o.nodes_to_exclude},
          {"device", o.device},
          {"threads", o.threads}};
}

void write_json_file(const std::string& path, const nlohmann::json& report) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::absolute(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = p.string() + ".nibble-part";
  {
    std::ofstream f(tmp);
    if (!f) throw Error("cannot write report " + p.string());
    f << report.dump(2) << "\n";
    if (!f) {
      std::remove(tmp.c_str());
      throw Error("cannot write report " + p.string());
    }
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error("cannot write report " + p.string() + ": " + ec.message());
  }
}

}  // namespace nibble

// Everything `nibble quantize` is asked to do: ModelOpt quantize.py's flags (same names, same
// defaults) plus nibble's own. Filled by the CLI, read by the pipeline, echoed in the report.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nibble {

enum class Format { kDq, kQdq, kMatMulNBits };

struct QuantizeOptions {
  // ModelOpt (examples/windows/onnx_ptq/genai_llm/quantize.py)
  std::string onnx_path;
  std::string output_path;
  std::string algo = "awq_lite";
  int64_t block_size = 128;
  bool use_zero_point = false;
  double awqlite_alpha_step = 0.1;
  bool awqlite_run_per_subgraph = false;
  bool awqlite_disable_fuse_nodes = false;
  double awqclip_alpha_step = 0.05;
  double awqclip_alpha_min = 0.5;
  int64_t awqclip_bsz_col = 1024;
  std::string calibration_eps = "cuda,cpu";
  int64_t calib_size = 32;
  std::string dataset = "cnn";
  int64_t batch_size = 1;
  bool no_position_ids = false;
  bool add_position_ids = false;
  bool no_past_kv_inputs = false;
  bool use_buffer_share = false;
  bool use_fp32 = false;
  bool use_random_calib = false;
  bool enable_mixed_quant = false;
  std::string layers_8bit;
  std::string gather_quantize_axis;
  int64_t gather_block_size = 32;
  bool use_column_major = false;
  std::vector<std::string> nodes_to_exclude{"/lm_head"};
  std::string model_name;
  // nibble's own
  std::string calib_data;     // .npz of ready model inputs instead of --dataset
  int64_t calib_seq_len = 512;
  std::string calib_cache;    // keep calibration statistics here and reuse them
  std::string mixed_strategy;  // modelopt | sensitivity (empty: modelopt when mixed precision is on)
  std::string mixed_budget;    // sensitivity: share of the weights at 8 bits (0..1) or an output size (300MB)
  std::string awq_mode = "nibble";  // modelopt: ModelOpt's arithmetic and quirks; nibble: fixed
  std::string device = "auto";
  std::string format;  // empty: dq for rtn_dq and the AWQ algorithms, qdq for rtn
  int threads = 0;     // 0: all cores
  bool force = false;
  std::string report;
  std::string config;
  bool quiet = false;
  bool verbose = false;

  Format resolved_format() const;
};

}  // namespace nibble

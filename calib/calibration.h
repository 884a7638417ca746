// Runs calib/capture.py (ONNX Runtime, one forward pass per batch) and memory-maps what it
// measured for each activation. Also runs its `grid` subcommand, which evaluates ModelOpt's AWQ
// scale formula with numpy itself (its SIMD float32 power decides ModelOpt's exact scales).
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "loaders/external_data.h"

namespace nibble {

class CalibCache;
class EngineCalibration;

// Which engine computes the activations calibration measures: ONNX Runtime (calib/capture.py, in a Python
// process) or nibble's own layer engine (forward/, calib/engine_calibration.h); kAuto: the layer engine
// wherever it can measure what the run asks for, else ONNX Runtime.
enum class CalibrationEngine { kAuto, kOrt, kNative };

// How calibration runs (the calibration flags of `nibble quantize`, same names).
struct CalibrationOptions {
  std::string calib_cache;      // keep the statistics here and reuse them
  std::string dataset = "cnn";  // text source when no calib_data
  std::string calib_data;       // .npz of ready model inputs
  std::string calibration_eps = "cuda,cpu";
  bool calibration_eps_given = false;  // on the command line or in --config: ONNX Runtime is asked for
  std::string model_name;       // where the tokenizer is
  int64_t calib_size = 32;
  int64_t calib_seq_len = 512;
  int64_t batch_size = 1;
  bool add_position_ids = false;
  bool no_position_ids = false;
  bool no_past_kv_inputs = false;
  bool use_buffer_share = false;
  bool use_fp32 = false;
  bool use_random_calib = false;  // seeded random token ids instead of a dataset
  int threads = 0;
  bool quiet = false;
  CalibrationEngine engine = CalibrationEngine::kAuto;
  std::string engine_fallback;  // why kAuto runs ONNX Runtime (empty where it runs the layer engine)
  // kNative: the engine, opened once per run and shared by every layer group's request (each batch's
  // forward pass goes on from where the previous group left it).
  std::shared_ptr<EngineCalibration> layer_engine;
};

// What calibration measured on one activation (a MatMul input with K channels).
struct ActivationStats {
  int64_t K = 0;
  int64_t rows = 0;               // tokens counted in gram
  const float* x_mean = nullptr;  // mean |x| per channel (float32)
  // XᵀX, K*K row-major, in host memory; null where only the backend holds it (the layer engine's on a
  // device: Calibration::gram_tensor).
  const double* gram = nullptr;
};

// What awq_clip asks calibration for besides (host/awq_clip.h): sample_tokens > 0 also keeps
// ModelOpt's token sample of each activation; gram_block > 0 keeps only the block-diagonal of XᵀX
// ([G, B, B]; the index's "gram" then names that file and stats() cannot be used).
// budget_mb > 0 caps the accumulators one pass over the calibration data holds (capture.py --budget_mb;
// 0: its default): past it the activations are split into groups, one forward pass each, with the same
// statistics.
struct CalibrationExtras {
  int64_t sample_tokens = 0;
  int64_t gram_block = 0;
  // Layer by layer (calib/README.md): measure only layer group `layer` of `layer_groups` (a JSON file of
  // activation names per group), its inputs read from and its outputs for the next group written to
  // the state folder `layer_state`.
  std::string layer_state, layer_groups;
  int layer = -1;
  // Quantized layers fed forward: the folder of what is quantized so far (calib/layers.py reads it); the
  // statistics run then leaves the next boundary to Calibration::advance.
  std::string layer_weights;
  int64_t budget_mb = 0;
};

// What the layer engine measured for one activation, held in memory (no file): the counted rows, Σ|x| per
// channel (float64, on the host: the search's mean |x| is host arithmetic) and XᵀX (each batch's product in
// float32, summed in float64), whole or its diagonal blocks, where the run's backend accumulated it (`gram`:
// a device's buffer, read there by the searches that take tensors; host memory on the CPU, where nothing
// moves). A whole XᵀX is kept as its upper triangle, row after row (K(K+1)/2 values: `packed`), until the
// search first reads it: layer by layer, the next group is measured while this one is searched, and its Grams
// (1.37 GB of float64 per 7B layer when whole) wait at half the size.
struct MeasuredActivation {
  int64_t K = 0, rows = 0, gram_block = 0;
  std::vector<double> sum_abs;
  kernels::Tensor gram;
  bool packed = false;
  kernels::Backend* backend = nullptr;  // the one that holds `gram`
  // The host copy of a Gram only the backend holds, for a search that reads host memory (made once, at
  // its first such read).
  std::vector<double> host_gram;
};
using kernels::packed_row;
// A packed XᵀX unfolded into the whole K x K matrix (both triangles), in place, by the backend that holds it
// (the result stays there); nothing where it is whole.
void unpack_gram(MeasuredActivation& m);
// The Gram's values in host memory: its own where the backend keeps it there, else the host copy
// (downloaded at the first call). Unpacks first.
const double* host_gram(MeasuredActivation& m);

class Calibration {
 public:
  struct Request {
    std::string name;
    int64_t K = 0;
  };
  // Captures statistics for `activations` of `model_path` into a temporary folder (or
  // options.calib_cache, kept and reused when it already holds them). Throws Error.
  using Extras = CalibrationExtras;
  static std::unique_ptr<Calibration> run(const CalibrationOptions& options, const std::string& model_path,
                                          const std::vector<Request>& activations, bool mask_padding,
                                          const Extras& extras = {});
  ~Calibration();
  // Layer by layer with the quantized layers fed forward: runs layer group extras.layer once more, with
  // the weights quantized so far, for the boundary of the next group only (no statistics).
  static void advance(const CalibrationOptions& options, const std::string& model_path,
                      const std::vector<Request>& activations, const Extras& extras);
  // Statistics the layer engine measured (calib/engine_calibration.h).
  static std::unique_ptr<Calibration> from_measured(std::map<std::string, MeasuredActivation> measured, int64_t tokens);

  // Statistics of one activation (x_mean is ModelOpt's numpy mean |x| when `numpy_mean`, else
  // sum|x| / rows over the counted rows).
  ActivationStats stats(const std::string& activation, bool numpy_mean);
  // The float64 Gram matrix as a tensor: where the layer engine left it (on the run's backend, unpacked
  // there), else a view of the host's file. Whole [K, K] (*block = 0), or where calibration kept only its
  // diagonal blocks [ceil(K/B), B, B] (*block = B; without `block` that is an Error).
  kernels::Tensor gram_tensor(const std::string& activation, int64_t K, int64_t* block = nullptr);
  // The activation's Gram matrix as float32 (what the loss GEMMs take); its float64 pages are dropped
  // from memory afterwards (read again from the file if asked again), so only the activation being
  // searched is resident.
  std::vector<float> gram_f32(const std::string& activation);
  // The Gram matrix as calibration kept it, float64, checked against K: the whole K x K (*block = 0)
  // or its block-diagonal [ceil(K/B), B, B] (*block = B, CalibrationExtras::gram_block).
  const double* gram_stored(const std::string& activation, int64_t K, int64_t* block);
  // Drops the pages of the activation's Gram matrix from memory (read again from the file if asked).
  void release_gram(const std::string& activation);
  // ModelOpt's token sample (CalibrationExtras::sample_tokens): *rows x K float32, nullptr when empty.
  const float* token_sample(const std::string& activation, int64_t K, int64_t* rows);
  int64_t tokens() const { return tokens_; }
  // The weights the layer engine's forward put on a device backend (initializer name -> its bytes as stored,
  // there), handed over once, so that the search and the quantizer read them without a second upload.
  std::map<std::string, kernels::Tensor> take_device_weights() { return std::move(device_weights_); }
  void give_device_weights(std::map<std::string, kernels::Tensor> w) { device_weights_ = std::move(w); }

  // ModelOpt's get_scale for every alpha, computed by numpy: one vector of K per alpha and item.
  struct GridItem {
    std::string id;
    std::vector<float> x_mean, w_mean;
  };
  // per_subgraph: the formula of ModelOpt's per-subgraph search instead of get_scale (calib/capture.py grid).
  std::map<std::string, std::vector<std::vector<float>>> numpy_grid(const std::vector<GridItem>& items,
                                                                     const std::vector<double>& alphas,
                                                                     bool per_subgraph = false);

 private:
  struct Entry {
    int64_t K = 0, rows = 0;
    int64_t gram_block = 0;         // 0: the whole K x K matrix
    int64_t token_sample_rows = 0;
    std::string mean_np, sum_abs, gram, token_sample;
    std::vector<float> x_mean;  // derived, owned
    std::shared_ptr<MeasuredActivation> measured;  // in memory instead of the files above (unpacked at first use)
  };
  std::string dir_;
  bool owned_dir_ = false;
  std::unique_ptr<CalibCache> cache_;  // --calib_cache: holds the entry's lock while dir_ is read
  int64_t tokens_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, kernels::Tensor> device_weights_;
  std::map<std::string, std::unique_ptr<MappedFile>> maps_;
  void read_index(const std::vector<Request>& acts);  // what capture.py measured, checked against acts
  const MappedFile& map(const std::string& file);
  const Entry& entry(const std::string& activation, int64_t K) const;  // checked against K
  const MappedFile& gram_map(const Entry& e);                            // checked against its size
};

// The Python interpreter and script nibble calls: $NIBBLE_PYTHON / $NIBBLE_CALIB_SCRIPT, else, for an
// installed binary, python3 and <prefix>/share/nibble/calib/capture.py; in a build folder, the
// project's .venv and calib/capture.py beside the build or in the source tree.
std::string python_executable();
std::string capture_script();
// A script of the project: $env_var, else `relative` under <prefix>/share/nibble when installed, under
// the build's parent or the source folder in a build folder.
std::string project_script(const char* env_var, const std::string& relative);

// Size and a content hash of every file the statistics depend on (the model and its external data, the
// calibration file, the tokenizer's and GenAI configuration files), keyed by canonical path: what the
// calibration cache and a layer-by-layer run's checkpoint compare to tell another model or data apart.
nlohmann::json calibration_input_fingerprints(const CalibrationOptions& o, const std::string& model_path);

// The calibration data's options on capture.py's command line (its `capture` and `feeds` take them alike).
void add_source_args(const CalibrationOptions& o, std::vector<std::string>& argv);

// Runs argv; stderr lines are passed through (unless quiet) and the last line starting with
// `error_prefix` becomes the Error message when the child fails. Throws Error.
void run_child(const std::vector<std::string>& argv, const std::string& error_prefix, bool quiet);

}  // namespace nibble

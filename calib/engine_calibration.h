// Calibration on nibble's own layer engine (forward/): the calibration batches' model inputs come from
// calib/capture.py once (`feeds`: the same texts, tokens and synthesised inputs ONNX Runtime would get),
// then nibble runs the graph itself, batch by batch, and folds each activation a request names into its
// statistics in memory (no statistics files, no numpy). Layer by layer, each batch's forward pass stops
// after the nodes that compute the requested layer group and goes on from there for the next group, its
// live values (the residual stream) held in memory between groups.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "calib/calibration.h"
#include "forward/graph_run.h"
#include "kernels/backend.h"
#include "loaders/onnx_model.h"

namespace nibble {

// The first node of the model the layer engine cannot run ("op_type (domain) at node 'name'", and how many
// more), or empty when it runs them all.
std::string layer_engine_cannot_run(const std::string& model_path);

class EngineCalibration {
 public:
  // Opens the model (the calibration feeds are written by capture.py at the first request). Throws Error,
  // one line, where the engine cannot run the model (it names the first operator it does not know).
  // `statistics`: the backend the run's search uses, where the statistics accumulate and stay (it must
  // outlive every Calibration this engine measures; a device's takes one caller at a time).
  EngineCalibration(const CalibrationOptions& o, const std::string& model_path, kernels::Backend& statistics);
  ~EngineCalibration();
  EngineCalibration(const EngineCalibration&) = delete;
  EngineCalibration& operator=(const EngineCalibration&) = delete;

  // Statistics of `acts` on every batch (rows in batch order). A request for values computed before where the batches
  // stopped starts them again from the first node. extras.gram_block > 0 keeps only XᵀX's diagonal
  // blocks; a token sample is refused (Error). With the quantized layers fed forward (extras.layer_weights
  // set), each batch goes back to where the previous request's group began and runs that group again with
  // the weights substituted since (its quantized form), then measures this group.

  std::unique_ptr<Calibration> measure(const std::vector<Calibration::Request>& acts, bool mask_padding,
                                       const CalibrationExtras& extras);
  // Every calibration batch's model inputs (joined batches as the engine runs them), for a second engine
  // over the same model (the layer learner, calib/layer_learning.h).
  std::vector<std::map<std::string, forward::Value>> batch_feeds();
  // The weight `name` runs as `v` from now on (forward::GraphRun::substitute).
  void substitute(const std::string& name, forward::Value v);
  // A device's copy of weight `name` (its bytes as stored) that a search uploaded, read by the next
  // request's forward instead of a second upload (forward::GraphRun::lend_device_upload).
  void lend_device_weight(const std::string& name, kernels::Tensor t);

  // Seconds in the forward pass and in the statistics, over every request so far.
  double forward_seconds() const { return forward_seconds_; }
  double statistics_seconds() const { return statistics_seconds_; }
  // The CPU seconds of the same work (its thread and its workers, kernels::CpuTally): beside the search
  // they share the cores, so this, not the wall time, is what the work cost.
  double cpu_seconds() const { return cpu_seconds_; }
  // The products among them (the forward's MatMul, Gemm and attention; the statistics' ssyrk): FLOPs
  // and seconds, whose ratio is the calibration's arithmetic rate.
  forward::ProductMeter forward_products() const { return graph_->products(); }
  forward::ProductMeter statistics_products() const { return statistics_products_; }
  // Bytes of the counted activation rows handed to the statistics (float32): on a device, read where the
  // forward left them.
  uint64_t statistics_row_bytes() const { return statistics_row_bytes_; }
  // Whether the forward runs on the device, and the activations it put there from the host.
  bool forward_on_device() const { return graph_->device() != nullptr; }
  uint64_t activation_upload_bytes() const { return graph_->activation_upload_bytes(); }
  // On a device: the operator types whose nodes ran on the host (no device form), nodes per type.
  const std::map<std::string, int64_t>& host_operators() const { return graph_->host_ops(); }

 private:
  // Calibration batches run together: consecutive batches whose inputs have the same shapes, joined along
  // their first (batch) axis up to kRowsPerChunk tokens, so that each product has more rows (sgemm runs
  // ~30% faster on 1024 rows than on 256 here). Each row's values are its batch's alone.
  static constexpr int64_t kRowsPerChunk = 1024;
  struct Batch {
    std::vector<std::string> dirs;
    std::vector<int64_t> token_mask;  // [rows of every batch, in order]
    forward::GraphRun::State state;
    bool started = false;
    forward::GraphRun::State group_start;  // where the last request's group began (quantized layers fed forward)
    bool has_group_start = false;
  };
  CalibrationOptions options_;
  kernels::Backend* statistics_;
  std::unique_ptr<OnnxModel> model_;
  std::unique_ptr<forward::GraphRun> graph_;
  std::string feeds_dir_;
  std::vector<Batch> batches_;
  int64_t tokens_ = 0;
  bool quiet_ = false;
  double forward_seconds_ = 0.0, statistics_seconds_ = 0.0, cpu_seconds_ = 0.0;
  forward::ProductMeter statistics_products_;
  uint64_t statistics_row_bytes_ = 0;
  std::mutex mu_;
  std::map<std::string, forward::Value> read_batch_feeds(Batch& b);
  void write_feeds();
};

}  // namespace nibble

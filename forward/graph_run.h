// Runs an ONNX graph node by node on the engine's operators (op_table.cc): the layer engine's interpreter.
// Initializers are views into the model's memory map; every intermediate value is dropped after its last
// reader, so memory holds the live activations only. The graph's nodes must be in topological order (as
// ONNX requires).
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "forward/matmul.h"
#include "forward/value.h"
#include "kernels/backend.h"
#include "loaders/onnx_model.h"

namespace nibble::forward {

struct OpEntry;

class GraphRun {
 public:
  explicit GraphRun(OnnxModel& model);

  // "op_type (domain) at node 'name'" for every node whose operator the engine does not know; empty when
  // the engine can run the whole graph.
  std::vector<std::string> unsupported() const;

  // Called for every value in `capture` as soon as it is computed (before it may be dropped).
  using Capture = std::function<void(const std::string& name, const Value& value)>;

  // A run that stops and goes on (the layer engine's calibration advances each batch one layer group at a
  // time): the values some later node still reads, and the next node to run.
  struct State {
    std::map<std::string, Value> live;
    std::map<std::string, int> left;  // readers still to come, per name
    size_t next = 0;
  };
  // The state before the first node, on `feeds` (graph inputs by name; an input without a feed is an empty
  // value, as an empty past key/value is). Feeds named in `capture` are reported here.
  State start(const std::map<std::string, Value>& feeds, const std::set<std::string>& capture = {},
              const Capture& on_capture = {});
  // Runs nodes [s.next, end). Throws Error (one line) on an unknown operator or bad shapes.
  void advance(State& s, size_t end, const std::set<std::string>& capture, const Capture& on_capture);
  size_t nodes() const { return size_t(model_.proto().graph().node_size()); }
  const onnx::NodeProto& node(size_t i) const { return model_.proto().graph().node(int(i)); }
  // Initializer `name` as the operators read it (a substitute where one was given), or null when the
  // graph has none of that name.
  const Value* weight(const std::string& name) { return initializer(name); }
  // The index of the node that computes `name`, or nodes() when a graph input or initializer is `name`
  // (Error when nothing does).
  size_t producer(const std::string& name) const;

  // The whole graph on `feeds`; the values named in `keep` (graph outputs or intermediates) come back.
  std::map<std::string, Value> run(const std::map<std::string, Value>& feeds, const std::set<std::string>& keep,
                                   const std::set<std::string>& capture, const Capture& on_capture);

  // From now on the initializer `name` reads as `v` (a quantized weight dequantized, fed forward in its
  // float form), whatever the file holds.
  void substitute(const std::string& name, Value v) {
    overrides_[name] = std::move(v);
    device_initializers_.erase(name);
    shared_initializers_.erase(name);
  }

  // The initializer `name` reads from the file again (the substitute dropped).
  void unsubstitute(const std::string& name) { overrides_.erase(name); }

  // Drops the resident pages of every initializer read so far (they come back from the file when read
  // again): the memory-mapped weights would otherwise stay in the process's memory once touched.
  void release_weights();

  // From now on the float operators with a device form (device_ops.h) run on `device` (a backend with a
  // transfer ledger), their values kept there; initializers go up once until release_weights. Values a host
  // operator reads come down (the ledger counts them); capture and run() hand over device values as they are
  // (host_value brings one back). Null: everything on the host (the CPU's engine).
  void use_backend(kernels::Backend* device) { device_ = device; }
  kernels::Backend* device() const { return device_; }
  // v with host data: a device value downloaded (its bits unchanged), any other as it is.
  Value host_value(const Value& v) const;
  // The initializers' uploads kept since release_weights (their bytes as stored, on the device; overrides
  // excepted), within a quarter of the device's budget: handed over, no longer held here.
  std::map<std::string, kernels::Tensor> take_device_uploads() { return std::move(device_uploads_); }
  // The device's copy of initializer `name` (its bytes as stored; a search uploaded it) for this run to read
  // instead of uploading it again, until release_weights; ignored for an initializer a node has read
  // already (its product ran: a later run reads it again only as a quantized override).
  void lend_device_upload(const std::string& name, kernels::Tensor t) {
    if (!read_.count(name)) lent_[name] = std::move(t);
  }
  // On a device: the bytes of activations (graph inputs, the host operators' results: embedding rows, token
  // positions) put on it, as they were on the host.
  uint64_t activation_upload_bytes() const { return activation_upload_bytes_; }
  // The operator types that ran on the host on a device run, with how many nodes each (for the report).
  const std::map<std::string, int64_t>& host_ops() const { return host_ops_; }

  // Seconds spent per operator type since construction (for the report).
  const std::map<std::string, double>& seconds_per_op() const { return seconds_; }
  // The products (MatMul, Gemm, attention) since construction: FLOPs and seconds.
  const ProductMeter& products() const { return products_; }

 private:
  OnnxModel& model_;
  // Initializers as the operators read them, made once (until release_weights): views of the map; an
  // fp16/bf16 one read a second time (the next batch) is widened to float32 then and kept (a wide value:
  // the products read it in place) while the widened copies stay under kWidenedBudget bytes. A view is
  // widened by each product that reads it, a few column panels at a time (matmul_widening), which costs
  // a single batch less than widening it whole first. 256 MiB: a 7B layer's attention weights; its MLP's
  // (540 MB more) would sit beside the search's Grams for a little time saved per batch.
  static constexpr size_t kWidenedBudget = size_t(256) << 20;
  std::map<std::string, Value> initializers_;
  size_t widened_bytes_ = 0;
  Floats weight_scratch_;  // OpCall::weight_scratch, given back with the weights
  std::vector<std::shared_ptr<TensorView>> views_;
  std::map<std::string, Value> overrides_;  // substitute()
  std::map<std::string, int> readers_;         // how many node inputs read each name
  std::map<std::string, size_t> producers_;    // node index per output name
  std::map<std::string, double> seconds_;
  ProductMeter products_;
  kernels::Backend* device_ = nullptr;
  std::map<std::string, Value> device_initializers_;  // uploaded once per group (release_weights)
  std::map<std::string, kernels::Tensor> device_uploads_;  // take_device_uploads
  // Initializers more than one node reads (the rotary caches of every layer): kept across release_weights.
  std::map<std::string, Value> shared_initializers_;
  std::map<std::string, kernels::Tensor> lent_;  // lend_device_upload
  std::set<std::string> read_;                    // initializers some node has read
  uint64_t device_upload_bytes_ = 0;
  uint64_t activation_upload_bytes_ = 0;
  std::map<std::string, int64_t> host_ops_;
  const Value* initializer(const std::string& name);
  // v on the device as float32 (uploaded, widened there); an initializer's upload is kept by name.
  Value device_value(const Value& v, const std::string& name, bool is_initializer);
  // One node: on the device where its operator has a device form that takes it, else on the host.
  std::vector<Value> run_node(const onnx::NodeProto& n, const OpEntry& op, std::vector<const Value*> in,
                              std::vector<bool> reusable);
  // Per input of n: whether n may overwrite it (OpCall::reusable): an activation n reads last, which no
  // other value, kept copy or saved state holds.
  std::vector<bool> reusable_inputs(const State& s, const onnx::NodeProto& n) const;
};

}  // namespace nibble::forward

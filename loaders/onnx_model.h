// An ONNX model opened for quantization: the graph parsed with protobuf (weights excluded: they
// stay in their external data files, memory-mapped on demand), and checked views of initializers.
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "loaders/external_data.h"
#include "loaders/tensor_view.h"

namespace nibble {

class OnnxModel {
 public:
  // Parses `path` (throws Error with a one-line reason on anything that is not a usable model).
  static std::unique_ptr<OnnxModel> load(const std::string& path);

  onnx::ModelProto& proto() { return model_; }
  const onnx::ModelProto& proto() const { return model_; }
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

  // Graph initializer by name, or nullptr.
  const onnx::TensorProto* initializer(const std::string& name) const;

  // Checked view of a tensor's bytes (external or inline). Float weights stored in typed fields
  // (float_data, fp16/bf16 in int32_data) are viewed as their raw little-endian bytes.
  TensorView view(const onnx::TensorProto& t);
  // Canonical path of the file an external view reads from.
  std::string external_path(const TensorView& v) const { return external_->resolve(v.name, v.ref.location); }
  // Drops the resident pages of an external tensor once it has been processed.
  void release(const TensorView& v);

  // Opset version imported for a domain ("" = default ONNX domain), 0 if absent.
  int64_t opset(const std::string& domain) const;

  // Canonical paths of the model file and of every external data file it references.
  std::vector<std::string> input_files();

 private:
  OnnxModel() = default;
  onnx::ModelProto model_;
  std::string path_;
  std::string dir_;
  std::unordered_map<std::string, int> initializer_index_;
  std::unique_ptr<ExternalDataMap> external_;
};

// Integer attribute `name` of a node, or `dflt` when the node does not set it.
int64_t int_attr(const onnx::NodeProto& n, const std::string& name, int64_t dflt);

}  // namespace nibble

#include "loaders/onnx_model.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <set>

#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {

std::unique_ptr<OnnxModel> OnnxModel::load(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("model file " + path + " does not exist");
  if (fs::is_directory(path, ec)) throw Error(path + " is a folder, not an ONNX model file");
  std::unique_ptr<OnnxModel> m(new OnnxModel());
  m->path_ = fs::weakly_canonical(path, ec).string();
  m->dir_ = fs::path(m->path_).parent_path().string();

  // The protobuf limit (2 GiB) applies to the graph file only; weights live in external data.
  MappedFile file(m->path_);
  if (file.size() == 0) throw Error(path + " is empty, not an ONNX model");
  if (file.size() > uint64_t(INT_MAX))
    throw Error(path + " is " + std::to_string(file.size() >> 20) +
                " MiB: protobuf cannot parse a graph over 2 GiB; save the weights as external data");
  google::protobuf::io::ArrayInputStream raw(file.data(), int(file.size()));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(INT_MAX);
  if (!m->model_.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    throw Error(path + " is not a valid ONNX model (protobuf parse failed: truncated or not ONNX)");
  if (!m->model_.has_graph() || m->model_.graph().node_size() == 0)
    throw Error(path + " is not an ONNX model with a graph (no nodes)");
  if (m->model_.ir_version() <= 0) throw Error(path + " has no ONNX ir_version");

  const auto& g = m->model_.graph();
  for (int i = 0; i < g.initializer_size(); ++i) {
    const auto& t = g.initializer(i);
    if (t.name().empty()) throw Error(path + ": initializer #" + std::to_string(i) + " has no name");
    if (!m->initializer_index_.emplace(t.name(), i).second)
      throw Error(path + ": initializer '" + t.name() + "' is defined twice");
    checked_numel(t);  // rejects negative dims and overflowing shapes up front
  }
  m->external_ = std::make_unique<ExternalDataMap>(m->dir_);
  return m;
}

const onnx::TensorProto* OnnxModel::initializer(const std::string& name) const {
  auto it = initializer_index_.find(name);
  return it == initializer_index_.end() ? nullptr : &model_.graph().initializer(it->second);
}

TensorView OnnxModel::view(const onnx::TensorProto& t) {
  TensorView v;
  v.name = t.name();
  v.dtype = static_cast<DType>(t.data_type());
  v.dims.assign(t.dims().begin(), t.dims().end());
  v.numel = checked_numel(t);
  const uint64_t want = expected_nbytes(t);

  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    v.external = true;
    v.ref = parse_external_ref(t);
    v.nbytes = v.ref.length;
    v.data = external_->view(t.name(), v.ref.location, v.ref.offset, v.ref.length);
    return v;
  }
  if (t.has_raw_data()) {
    if (want != 0 && t.raw_data().size() != want)
      throw Error("tensor '" + t.name() + "': raw_data holds " + std::to_string(t.raw_data().size()) +
                  " bytes, its shape and dtype need " + std::to_string(want));
    v.data = reinterpret_cast<const uint8_t*>(t.raw_data().data());
    v.nbytes = t.raw_data().size();
    return v;
  }
  auto count_error = [&](const char* field, int have) {
    return Error("tensor '" + t.name() + "': " + field + " holds " + std::to_string(have) +
                 " values, its shape needs " + std::to_string(v.numel));
  };
  if (v.dtype == DType::kFloat32) {
    if (t.float_data_size() != v.numel) throw count_error("float_data", t.float_data_size());
    v.data = reinterpret_cast<const uint8_t*>(t.float_data().data());
    v.nbytes = want;
    return v;
  }
  if (v.dtype == DType::kFloat16 || v.dtype == DType::kBFloat16) {
    // Each int32 holds one 16-bit pattern: convert to the packed layout the kernels read.
    if (t.int32_data_size() != v.numel) throw count_error("int32_data", t.int32_data_size());
    v.owned = std::make_shared<std::vector<uint8_t>>(size_t(want));
    auto* dst = reinterpret_cast<uint16_t*>(v.owned->data());
    for (int64_t i = 0; i < v.numel; ++i) dst[i] = uint16_t(t.int32_data(int(i)));
    v.data = v.owned->data();
    v.nbytes = want;
    return v;
  }
  throw Error("tensor '" + t.name() + "' (" + dtype_name(t.data_type()) +
              ") has no raw_data or external data nibble can read");
}

void OnnxModel::release(const TensorView& v) {
  if (v.external) external_->release(v.ref.location, v.ref.offset, v.ref.length);
}

int64_t OnnxModel::opset(const std::string& domain) const {
  for (const auto& o : model_.opset_import()) {
    const std::string d = o.domain() == "ai.onnx" ? "" : o.domain();
    if (d == domain) return o.version();
  }
  return 0;
}

std::vector<std::string> OnnxModel::input_files() {
  std::set<std::string> files{path_};
  for (const auto& t : model_.graph().initializer())
    if (t.data_location() == onnx::TensorProto::EXTERNAL)
      files.insert(external_->resolve(t.name(), parse_external_ref(t).location));
  return {files.begin(), files.end()};
}

}  // namespace nibble

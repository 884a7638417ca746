#include "loaders/onnx_model.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

// Everything about an initializer that can be checked without opening a data file: dims (no
// negative, no overflow), a known data_type, inline bytes/value counts that match the shape, and
// well-formed external_data entries whose length matches the shape.
void check_stored_size(const onnx::TensorProto& t) {
  const uint64_t want = expected_nbytes(t);  // checks dims and data_type
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    parse_external_ref(t);
    return;
  }
  const int64_t n = checked_numel(t);
  if (t.has_raw_data()) {
    if (onnx_element_bits(t.data_type()) != 0 && t.raw_data().size() != want)
      throw Error("tensor '" + t.name() + "': raw_data holds " + std::to_string(t.raw_data().size()) +
                  " bytes, its shape and dtype need " + std::to_string(want));
    return;
  }
  auto count_error = [&](const char* field, int have) {
    return Error("tensor '" + t.name() + "': " + field + " holds " + std::to_string(have) +
                 " values, its shape needs " + std::to_string(n));
  };
  const auto dt = static_cast<DType>(t.data_type());
  if (dt == DType::kFloat32 && t.float_data_size() != n) throw count_error("float_data", t.float_data_size());
  if ((dt == DType::kFloat16 || dt == DType::kBFloat16) && t.int32_data_size() != n)
    throw count_error("int32_data", t.int32_data_size());
}

std::string node_label(const onnx::NodeProto& n, int index) {
  return n.name().empty() ? "#" + std::to_string(index) + " (" + n.op_type() + ")"
                          : "'" + n.name() + "' (" + n.op_type() + ")";
}

// The graph must be one the quantizer can rewrite into a valid model: every tensor name defined
// once (graph input, initializer or node output; an initializer may double as a graph input),
// every node input and graph output defined, and no cycle. The node order itself does not matter
// to nibble (ONNX Runtime sorts nodes at load), so an unsorted acyclic graph is accepted.
void check_graph(const std::string& path, const onnx::GraphProto& g) {
  enum Kind { kInput, kInitializer, kNode };
  std::unordered_map<std::string, std::pair<Kind, int>> defined;  // name -> (kind, node index)
  for (const auto& in : g.input()) {
    if (in.name().empty()) throw Error(path + ": a graph input has no name");
    if (!defined.emplace(in.name(), std::make_pair(kInput, -1)).second)
      throw Error(path + ": graph input '" + in.name() + "' is declared twice");
  }
  auto define_init = [&](const std::string& name) {
    auto it = defined.find(name);
    if (it == defined.end()) defined.emplace(name, std::make_pair(kInitializer, -1));
    else if (it->second.first != kInput)  // initializer twice: load() reports it first
      throw Error(path + ": initializer '" + name + "' is defined twice");
  };
  for (const auto& t : g.initializer()) define_init(t.name());
  for (const auto& st : g.sparse_initializer()) define_init(st.values().name());
  for (int i = 0; i < g.node_size(); ++i) {
    for (const auto& out : g.node(i).output()) {
      if (out.empty()) continue;  // an optional output left out
      auto [it, fresh] = defined.emplace(out, std::make_pair(kNode, i));
      if (fresh) continue;
      const auto [kind, other] = it->second;
      throw Error(path + ": tensor '" + out + "' is produced by node " + node_label(g.node(i), i) +
                  " but is already " +
                  (kind == kInput ? std::string("a graph input")
                   : kind == kInitializer ? std::string("an initializer")
                                          : "produced by node " + node_label(g.node(other), other)));
    }
  }
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& in : g.node(i).input())
      if (!in.empty() && !defined.count(in))
        throw Error(path + ": node " + node_label(g.node(i), i) + " reads '" + in +
                    "', which no graph input, initializer or node output defines");
  for (const auto& out : g.output())
    if (!defined.count(out.name()))
      throw Error(path + ": graph output '" + out.name() + "' is not produced by any node, input or initializer");

  // Kahn's algorithm over node -> node edges.
  const int n = g.node_size();
  std::vector<int> pending(static_cast<size_t>(n), 0);
  std::vector<std::vector<int>> consumers(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    for (const auto& in : g.node(i).input()) {
      if (in.empty()) continue;
      const auto& d = defined.at(in);
      if (d.first != kNode) continue;
      consumers[size_t(d.second)].push_back(i);
      ++pending[size_t(i)];
    }
  std::vector<int> ready;
  for (int i = 0; i < n; ++i)
    if (pending[size_t(i)] == 0) ready.push_back(i);
  int done = 0;
  while (!ready.empty()) {
    const int i = ready.back();
    ready.pop_back();
    ++done;
    for (int c : consumers[size_t(i)])
      if (--pending[size_t(c)] == 0) ready.push_back(c);
  }
  if (done == n) return;
  // Name a cycle: walk back from an unfinished node through unfinished producers until one repeats.
  int at = 0;
  while (pending[size_t(at)] == 0) ++at;
  std::vector<int> walk;
  std::vector<int> seen_at(static_cast<size_t>(n), -1);
  while (seen_at[size_t(at)] < 0) {
    seen_at[size_t(at)] = int(walk.size());
    walk.push_back(at);
    int next = -1;
    for (const auto& in : g.node(at).input()) {
      if (in.empty()) continue;
      const auto& d = defined.at(in);
      if (d.first == kNode && pending[size_t(d.second)] > 0) {
        next = d.second;
        break;
      }
    }
    at = next;  // an unfinished node always has an unfinished producer
  }
  std::vector<int> cycle(walk.begin() + seen_at[size_t(at)], walk.end());
  std::string desc;
  for (size_t k = cycle.size(); k-- > 0;) {
    if (!desc.empty()) desc += " -> ";
    if (cycle.size() - k > 6) {
      desc += "...";
      break;
    }
    desc += node_label(g.node(cycle[k]), cycle[k]);
  }
  throw Error(path + ": the graph has a cycle (" +
              (cycle.size() == 1 ? "node " + desc + " reads its own output" : desc + " -> back") +
              "); ONNX graphs must be acyclic");
}

}  // namespace

std::unique_ptr<OnnxModel> OnnxModel::load(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("model file " + path + " does not exist");
  if (fs::is_directory(path, ec)) throw Error(path + " is a folder, not an ONNX model file");
  std::unique_ptr<OnnxModel> m(new OnnxModel());
  m->path_ = fs::weakly_canonical(path, ec).string();
  if (ec || m->path_.empty()) m->path_ = fs::absolute(path).string();
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
    check_stored_size(t);  // dims, data_type, and how many bytes/values the tensor holds
  }
  check_graph(path, g);
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
    // The map is page-aligned, the offset need not be: ONNX does not require it, and the kernels
    // read elements through typed pointers. A weight whose offset is not a multiple of its element
    // size is copied once into an aligned buffer (rare: writers align large tensors).
    const int bits = onnx_element_bits(t.data_type());
    if (bits > 8 && v.ref.offset % uint64_t(bits / 8) != 0) {
      const size_t words = size_t((v.nbytes + 7) / 8);
      auto buf = std::make_shared<std::vector<uint64_t>>(words);
      if (v.nbytes) std::memcpy(buf->data(), v.data, size_t(v.nbytes));
      v.aligned_copy = buf;
      v.data = reinterpret_cast<const uint8_t*>(buf->data());
    }
    return v;
  }
  if (t.has_raw_data()) {
    if (onnx_element_bits(t.data_type()) != 0 && t.raw_data().size() != want)
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

int64_t int_attr(const onnx::NodeProto& n, const std::string& name, int64_t dflt) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return dflt;
}

}  // namespace nibble

#include "loaders/output_files.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "loaders/owner.h"

namespace fs = std::filesystem;

namespace nibble {

std::string temporary_name(const std::string& final_name) {
  return "." + final_name + kTmpTag + owner_tag(current_owner());
}

std::string data_file_name(const std::string& out_name, const std::string& hash_hex) {
  return out_name + "." + hash_hex + ".data";
}

bool is_hashed_data_file(const std::string& out_name, const std::string& name) {
  const size_t n = out_name.size();
  if (name.size() != n + 1 + 16 + 5 || name.compare(0, n, out_name) != 0 || name[n] != '.') return false;
  if (name.compare(n + 17, 5, ".data") != 0) return false;
  return std::all_of(name.begin() + long(n) + 1, name.begin() + long(n) + 17,
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); });
}

void for_each_tensor(onnx::GraphProto& g, const std::function<void(onnx::TensorProto&)>& fn) {
  for (auto& t : *g.mutable_initializer()) fn(t);
  for (auto& s : *g.mutable_sparse_initializer()) {
    fn(*s.mutable_values());
    fn(*s.mutable_indices());
  }
  for (auto& node : *g.mutable_node())
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_t()) fn(*a.mutable_t());
      for (auto& t : *a.mutable_tensors()) fn(t);
      if (a.has_g()) for_each_tensor(*a.mutable_g(), fn);
      for (auto& sub : *a.mutable_graphs()) for_each_tensor(sub, fn);
    }
}

bool external_locations(const std::string& path, std::set<std::string>* out) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return true;
  std::ifstream f(path, std::ios::binary);
  onnx::ModelProto m;
  if (!f || !m.ParseFromIstream(&f)) return false;
  for_each_tensor(*m.mutable_graph(), [&](onnx::TensorProto& t) {
    for (const auto& e : t.external_data())
      if (e.key() == "location") out->insert(e.value());
  });
  return true;
}

namespace {

// The owner of a temporary `name` and the final name it stands for; false if it is not one.
bool temporary_of(const std::string& name, Owner* owner, std::string* final_name) {
  const auto pos = name.rfind(kTmpTag);
  if (name.empty() || name[0] != '.' || pos == std::string::npos || pos < 2) return false;
  *final_name = name.substr(1, pos - 1);
  return parse_owner_tag(name.substr(pos + sizeof(kTmpTag) - 1), owner);
}

}  // namespace

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    Owner owner;
    std::string final_name;
    if (temporary_of(e.path().filename().string(), &owner, &final_name) && !owner_alive(owner))
      fs::remove(e.path(), ec);
  }
}

void remove_stray_data_files(const std::string& dir, const std::string& out_name,
                             const std::vector<std::string>& keep) {
  // Listed before anything else is looked at: a data file listed here was in place before the checks
  // below, so either its run's graph temporary is still there (a live writer: skipped), or its graph is
  // in place and references it, or it is a stray.
  std::vector<fs::path> candidates;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_hashed_data_file(out_name, e.path().filename().string())) candidates.push_back(e.path());
  if (candidates.empty()) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    Owner owner;
    std::string final_name;
    if (temporary_of(e.path().filename().string(), &owner, &final_name) &&
        (final_name == out_name || final_name == out_name + ".data") && owner_alive(owner))
      return;  // a live run writes this output
  }
  std::set<std::string> used;
  if (!external_locations((fs::path(dir) / out_name).string(), &used)) return;  // not a graph we can judge by
  for (const auto& p : candidates) {
    const std::string canonical = fs::weakly_canonical(p, ec).string();
    if (used.count(p.filename().string()) || std::find(keep.begin(), keep.end(), canonical) != keep.end()) continue;
    fs::remove(p, ec);
  }
}

}  // namespace nibble

#include "forward/forward_files.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loaders/durable.h"
#include "loaders/error.h"
#include "loaders/json_file.h"

namespace nibble::forward {

namespace {
DType dtype_named(const std::string& s, const std::string& where) {
  if (s == "int64") return DType::kInt64;
  if (s == "int32") return DType::kInt32;
  if (s == "float32") return DType::kFloat32;
  if (s == "float16") return DType::kFloat16;
  throw Error(where + ": dtype '" + s + "' is not one of int64, int32, float32, float16");
}

std::string read_bytes(const std::string& path, size_t expected) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path + ": " + errno_text(errno));
  std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (b.size() != expected)
    throw Error(path + " holds " + std::to_string(b.size()) + " bytes, its entry's shape needs " + std::to_string(expected));
  return b;
}
}  // namespace

std::map<std::string, Value> read_feeds(const std::string& dir) {
  const std::string index = dir + "/index.json";
  const nlohmann::json j = read_json_file(index);
  if (!j.is_array()) throw Error(index + ": expected a list of feeds");
  std::map<std::string, Value> feeds;
  for (const auto& e : j) {
    try {
      const std::string name = e.at("name").get<std::string>();
      const DType t = dtype_named(e.at("dtype").get<std::string>(), index);
      std::vector<int64_t> shape = e.at("shape").get<std::vector<int64_t>>();
      void* p = nullptr;
      Value v = new_value(t, shape, &p);
      const std::string bytes = read_bytes(dir + "/" + e.at("file").get<std::string>(), v.bytes());
      std::memcpy(p, bytes.data(), bytes.size());
      feeds[name] = std::move(v);
    } catch (const nlohmann::json::exception& x) {
      throw Error(index + ": a feed entry lacks name, dtype, shape or file (" + std::string(x.what()) + ")");
    }
  }
  return feeds;
}

void write_values(const std::string& dir, const std::map<std::string, Value>& values, const nlohmann::json& extra) {
  if (mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) throw Error("cannot create " + dir + ": " + errno_text(errno));
  nlohmann::json list = nlohmann::json::array();
  int i = 0;
  for (const auto& [name, v] : values) {
    const std::string file = "v" + std::to_string(i++) + ".bin";
    if (v.is_float()) {
      const auto f = to_floats(narrow(v));  // what ONNX Runtime's graph output would hold
      write_file_durably(dir + "/" + file, f.data(), f.size() * 4);
    } else {
      const auto x = to_ints(v);
      write_file_durably(dir + "/" + file, x.data(), x.size() * 8);
    }
    list.push_back({{"name", name}, {"dtype", v.is_float() ? "float32" : "int64"}, {"shape", v.shape}, {"file", file}});
  }
  nlohmann::json top = {{"values", list}, {"extra", extra}};
  write_file_durably(dir + "/index.json", top.dump(1));
}

}  // namespace nibble::forward

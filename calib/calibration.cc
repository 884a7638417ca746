#include "calib/calibration.h"
#include "calib/stats_space.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "calib/calib_cache.h"
#include "calib/capture_server.h"
#include "calib/child_process.h"
#include "calib/engine_calibration.h"
#include "kernels/quant_types.h"
#include "loaders/content_hash.h"
#include "loaders/external_data.h"
#include "loaders/error.h"
#include "loaders/json_file.h"
#include "loaders/onnx_model.h"

extern char** environ;
namespace fs = std::filesystem;

namespace nibble {
namespace {

fs::path exe_dir() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : p.parent_path();
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Size and the XXH64 of the content (nibble's one hash): whole files up to 64 MiB; for larger ones 64
// windows of 64 KiB spread over the file, plus its modification time. A file rewritten in place or
// replaced under the same name then no longer matches statistics measured on the old one.
nlohmann::json file_fingerprint(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return "missing";
  constexpr uint64_t kWhole = 64ull << 20, kWin = 64 << 10, kWins = 64;
  std::ifstream f(path, std::ios::binary);
  ContentHash h;
  std::vector<char> buf(kWin);
  auto hash_at = [&](uint64_t off, uint64_t len) {
    f.clear();
    f.seekg(std::streamoff(off));
    while (len > 0) {
      f.read(buf.data(), std::streamsize(std::min<uint64_t>(len, kWin)));
      const auto got = uint64_t(f.gcount());
      if (got == 0) break;
      h.update(buf.data(), size_t(got));
      len -= got;
    }
  };
  nlohmann::json j = {{"size", size}};
  if (size <= kWhole) {
    hash_at(0, size);
  } else {
    for (uint64_t w = 0; w < kWins; ++w) hash_at((size - kWin) / (kWins - 1) * w, kWin);
    j["mtime"] = int64_t(fs::last_write_time(path, ec).time_since_epoch().count());
  }
  j["xxh64"] = h.hex();
  return j;
}

// Every file whose content the statistics depend on: the model and its external data, the
// calibration file, and the tokenizer's and GenAI configuration files.
nlohmann::json input_fingerprints(const CalibrationOptions& o, const std::string& model_path) {
  std::vector<std::string> files = OnnxModel::load(model_path)->input_files();
  if (!o.calib_data.empty()) files.push_back(o.calib_data);
  std::error_code ec;
  if (o.calib_data.empty() && !o.use_random_calib && fs::is_regular_file(o.dataset, ec)) files.push_back(o.dataset);
  const fs::path model_dir = fs::path(model_path).parent_path();
  fs::path tok = o.model_name.empty() ? model_dir : fs::path(o.model_name);
  if (fs::is_regular_file(tok, ec)) tok = tok.parent_path();
  for (const auto* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    if (fs::exists(tok / f, ec)) files.push_back((tok / f).string());
  for (const auto* f : {"genai_config.json", "config.json"})
    if (fs::exists(model_dir / f, ec)) files.push_back((model_dir / f).string());
  nlohmann::json out = nlohmann::json::object();
  for (const auto& f : files) out[fs::weakly_canonical(f, ec).string()] = file_fingerprint(f);
  return out;
}

}  // namespace

nlohmann::json calibration_input_fingerprints(const CalibrationOptions& o, const std::string& model_path) {
  return input_fingerprints(o, model_path);
}

namespace {

// Where the binary was installed (`cmake --install`, or the wheel): <prefix>/bin/nibble beside
// <prefix>/share/nibble, the relative path fixed at configure time (NIBBLE_DATA_FROM_BIN). An
// installed binary looks only there, so that it keeps working once the source tree is gone.
fs::path installed_data_dir() {
  std::error_code ec;
  const fs::path d = (exe_dir() / NIBBLE_DATA_FROM_BIN).lexically_normal();
  return fs::is_directory(d / "calib", ec) ? d : fs::path();
}

// A binary still in its CMake build folder (CMakeCache.txt beside it) uses the project beside the
// build folder, else the source tree it was configured from.
std::vector<fs::path> script_roots() {
  if (fs::path d = installed_data_dir(); !d.empty()) return {d};
  std::error_code ec;
  if (fs::exists(exe_dir() / "CMakeCache.txt", ec)) return {exe_dir().parent_path(), fs::path(NIBBLE_SOURCE_DIR)};
  return {};
}

}  // namespace

// $NIBBLE_PYTHON; in a build folder, the project's .venv; installed, a python3 beside the binary (a
// venv nibble was installed into), else `python3` from PATH. The scripts check their own imports
// and name what is missing in one line.
std::string python_executable() {
  if (const char* p = std::getenv("NIBBLE_PYTHON"); p && *p) return p;
  std::error_code ec;
  if (!installed_data_dir().empty()) {
    const fs::path beside = exe_dir() / "python3";
    return fs::exists(beside, ec) ? beside.string() : "python3";
  }
  for (const fs::path& root : script_roots()) {
    const fs::path venv = root / ".venv" / "bin" / "python";
    if (fs::exists(venv, ec)) return venv.string();
  }
  return "python3";
}

std::string project_script(const char* env_var, const std::string& relative) {
  if (const char* p = std::getenv(env_var); p && *p) return p;
  const std::vector<fs::path> roots = script_roots();
  std::error_code ec;
  for (const fs::path& root : roots) {
    const fs::path s = root / relative;
    if (fs::exists(s, ec)) return s.string();
  }
  std::string looked;
  for (const fs::path& root : roots.empty() ? std::vector<fs::path>{exe_dir() / NIBBLE_DATA_FROM_BIN} : roots)
    looked += (looked.empty() ? "" : " or ") + (root / relative).lexically_normal().string();
  throw Error("cannot find " + looked + " (install nibble with `cmake --install` or pip, or set " + env_var + ")");
}

std::string capture_script() { return project_script("NIBBLE_CALIB_SCRIPT", "calib/capture.py"); }

void run_child(const std::vector<std::string>& argv, const std::string& error_prefix, bool quiet) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw Error("pipe: " + errno_text(errno));
  pid_t pid = 0;
  try {
    pid = spawn_child(argv, {{pipefd[1], 2}});
  } catch (...) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    throw;
  }
  ::close(pipefd[1]);
  ChildStderr err{error_prefix, quiet};
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(pipefd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    err.take(buf, size_t(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (!err.last_error.empty()) throw Error(err.last_error);
  throw Error(argv[0] + " failed (" + exit_text(status) + (err.last_line.empty() ? "" : ": " + err.last_line) +
              "): " + shell_join(argv));
}

namespace {

// What a cache is keyed on: these activations, measured the same way from the same inputs.
nlohmann::json cache_settings(const CalibrationOptions& o, const std::string& model_path, const nlohmann::json& req,
                              bool mask_padding, const CalibrationExtras& extras, bool cached) {
  std::error_code ec;
  nlohmann::json settings = {{"model", fs::weakly_canonical(model_path, ec).string()},
                             {"dataset", o.dataset},
                             {"calib_data", o.calib_data},
                             {"random_calib", o.use_random_calib},
                             {"calib_size", o.calib_size},
                             {"seq_len", o.calib_seq_len},
                             {"batch_size", o.batch_size},
                             {"mask_padding", mask_padding},
                             {"position_ids", o.add_position_ids ? "add" : o.no_position_ids ? "no" : "auto"},
                             {"model_name", o.model_name},
                             {"use_fp32", o.use_fp32},
                             {"use_buffer_share", o.use_buffer_share},
                             {"no_past_kv_inputs", o.no_past_kv_inputs},
                             {"activations", req}};
  if (cached) settings["files"] = input_fingerprints(o, model_path);
  if (extras.sample_tokens > 0) settings["sample_tokens"] = extras.sample_tokens;
  if (extras.gram_block > 0) settings["gram_block"] = extras.gram_block;
  return settings;
}

}  // namespace

void add_source_args(const CalibrationOptions& o, std::vector<std::string>& argv) {
  auto add = [&](const char* flag, const std::string& v) {
    argv.push_back(flag);
    argv.push_back(v);
  };
  add("--calib_size", std::to_string(o.calib_size));
  add("--seq_len", std::to_string(o.calib_seq_len));
  add("--batch_size", std::to_string(o.batch_size));
  if (!o.calib_data.empty()) add("--calib_data", o.calib_data);
  else add("--dataset", o.dataset);
  if (!o.model_name.empty()) add("--tokenizer", o.model_name);
  for (const auto& [on, flag] : {std::pair{o.use_random_calib, "--random_calib"},
                                 {o.add_position_ids, "--add_position_ids"},
                                 {o.no_position_ids, "--no_position_ids"},
                                 {o.no_past_kv_inputs, "--no_past_kv_inputs"},
                                 {o.use_buffer_share, "--use_buffer_share"},
                                 {o.use_fp32, "--use_fp32"}})
    if (on) argv.push_back(flag);
}

namespace {

// calib/capture.py's command line for these options.
std::vector<std::string> capture_argv(const CalibrationOptions& o, const std::string& model_path, const fs::path& dir,
                                      bool mask_padding, const CalibrationExtras& extras) {
  std::vector<std::string> argv = {"capture",
                                   "--model", model_path, "--out", dir.string(),
                                   "--activations", (dir / "activations.json").string(),
                                   "--eps", o.calibration_eps,
                                   "--mask_padding", mask_padding ? "1" : "0"};
  auto add = [&](const char* flag, const std::string& v) {
    argv.push_back(flag);
    argv.push_back(v);
  };
  add_source_args(o, argv);
  if (o.threads > 0) add("--threads", std::to_string(o.threads));
  if (extras.sample_tokens > 0) add("--sample_tokens", std::to_string(extras.sample_tokens));
  if (extras.gram_block > 0) add("--gram_block", std::to_string(extras.gram_block));
  if (!extras.layer_state.empty()) {
    add("--layer_state", extras.layer_state);
    add("--layer_groups", extras.layer_groups);
    add("--layer", std::to_string(extras.layer));
    if (!extras.layer_weights.empty()) add("--layer_weights", extras.layer_weights);
  }
  if (extras.budget_mb > 0) add("--budget_mb", std::to_string(extras.budget_mb));
  return argv;
}

}  // namespace

std::unique_ptr<Calibration> Calibration::run(const CalibrationOptions& o, const std::string& model_path,
                                              const std::vector<Request>& acts, bool mask_padding,
                                              const Extras& extras) {
  if (o.layer_engine) return o.layer_engine->measure(acts, mask_padding, extras);
  std::unique_ptr<Calibration> c(new Calibration());
  nlohmann::json req = nlohmann::json::array();
  for (const auto& a : acts) req.push_back({{"name", a.name}, {"K", a.K}});
  const bool cached = !o.calib_cache.empty();
  const nlohmann::json settings = cache_settings(o, model_path, req, mask_padding, extras, cached);
  std::string out;
  if (cached) {
    c->cache_ = std::make_unique<CalibCache>(o.calib_cache, settings);
    c->dir_ = c->cache_->reusable();
    if (c->dir_.empty()) out = c->cache_->begin_write();
  } else {
    const std::string tmp = fs::temp_directory_path().string();
    sweep_dead_statistics(tmp);
    check_free_space(tmp, statistics_bytes(acts, extras), "calibration of " + std::to_string(acts.size()) + " activations");
    std::string tmpl = statistics_dir_template(tmp);
    if (!::mkdtemp(tmpl.data())) throw Error("cannot create a temporary folder: " + errno_text(errno));
    c->dir_ = out = tmpl;
    c->owned_dir_ = true;
  }
  if (!out.empty()) {
    {
      std::ofstream f(fs::path(out) / "activations.json");
      f << req.dump();
    }
    run_capture(capture_argv(o, model_path, out, mask_padding, extras), o.quiet);
    if (cached) c->dir_ = c->cache_->commit();
  }
  c->read_index(acts);
  return c;
}

void Calibration::advance(const CalibrationOptions& o, const std::string& model_path,
                          const std::vector<Request>& acts, const Extras& extras) {
  std::string tmpl = statistics_dir_template(fs::temp_directory_path().string());
  if (!::mkdtemp(tmpl.data())) throw Error("cannot create a temporary folder: " + errno_text(errno));
  const fs::path dir(tmpl);
  nlohmann::json req = nlohmann::json::array();
  for (const auto& a : acts) req.push_back({{"name", a.name}, {"K", a.K}});
  std::error_code ec;
  try {
    {
      std::ofstream f(dir / "activations.json");
      f << req.dump();
    }
    auto argv = capture_argv(o, model_path, dir, false, extras);
    argv.push_back("--layer_advance");
    run_capture(argv, o.quiet);
  } catch (...) {
    fs::remove_all(dir, ec);
    throw;
  }
  fs::remove_all(dir, ec);
}

void unpack_gram(MeasuredActivation& m) {
  if (!m.packed) return;
  m.gram = m.backend->unpack_gram(m.gram, m.K);  // the packed triangle goes with its last handle
  m.packed = false;
}

const double* host_gram(MeasuredActivation& m) {
  unpack_gram(m);
  if (m.gram.data) return m.gram.f64();
  if (m.host_gram.empty()) {  // a search that reads host memory, of a Gram the device holds: it comes back once
    const std::vector<uint8_t> raw = m.backend->download(m.gram);
    m.host_gram.resize(raw.size() / 8);
    std::memcpy(m.host_gram.data(), raw.data(), raw.size());
  }
  return m.host_gram.data();
}

std::unique_ptr<Calibration> Calibration::from_measured(std::map<std::string, MeasuredActivation> measured,
                                                        int64_t tokens) {
  std::unique_ptr<Calibration> c(new Calibration());
  c->tokens_ = tokens;
  for (auto& [name, m] : measured) {
    Entry e;
    e.K = m.K;
    e.rows = m.rows;
    e.gram_block = m.gram_block;
    e.measured = std::make_shared<MeasuredActivation>(std::move(m));
    c->entries_[name] = std::move(e);
  }
  return c;
}

void Calibration::read_index(const std::vector<Request>& acts) {
  const nlohmann::json index = read_json_file((fs::path(dir_) / "index.json").string());
  tokens_ = index.value("tokens_total", int64_t(0));
  for (const auto& a : index.at("activations")) {
    Entry e;
    e.K = a.at("K").get<int64_t>();
    e.rows = a.at("rows").get<int64_t>();
    e.mean_np = a.at("mean_abs_np").get<std::string>();
    e.sum_abs = a.at("sum_abs").get<std::string>();
    e.gram = a.at("gram").get<std::string>();
    e.gram_block = a.value("gram_block", int64_t(0));
    e.token_sample = a.value("token_sample", std::string());
    e.token_sample_rows = a.value("token_sample_rows", int64_t(0));
    entries_[a.at("name").get<std::string>()] = std::move(e);
  }
  for (const auto& a : acts)
    if (!entries_.count(a.name)) throw Error("calibration did not measure activation '" + a.name + "'");
}

Calibration::~Calibration() {
  maps_.clear();
  if (owned_dir_) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

const MappedFile& Calibration::map(const std::string& file) {
  auto it = maps_.find(file);
  if (it == maps_.end()) it = maps_.emplace(file, std::make_unique<MappedFile>((fs::path(dir_) / file).string())).first;
  return *it->second;
}

const Calibration::Entry& Calibration::entry(const std::string& activation, int64_t K) const {
  const auto it = entries_.find(activation);
  if (it == entries_.end()) throw Error("calibration did not measure activation '" + activation + "'");
  if (it->second.K != K)
    throw Error("calibration of '" + activation + "' has K " + std::to_string(it->second.K) + ", the weight " +
                std::to_string(K));
  return it->second;
}

const MappedFile& Calibration::gram_map(const Entry& e) {
  const MappedFile& gram = map(e.gram);
  const int64_t B = e.gram_block;
  const uint64_t want = B ? uint64_t(kernels::num_blocks(e.K, B) * B * B) * 8 : uint64_t(e.K * e.K) * 8;
  if (gram.size() != want)
    throw Error("calibration file " + gram.path() + " has " + std::to_string(gram.size()) + " bytes, expected " +
                std::to_string(want));
  return gram;
}

const double* Calibration::gram_stored(const std::string& activation, int64_t K, int64_t* block) {
  const Entry& e = entry(activation, K);
  *block = e.gram_block;
  if (e.measured) return host_gram(*e.measured);
  return reinterpret_cast<const double*>(gram_map(e).data());
}

kernels::Tensor Calibration::gram_tensor(const std::string& activation, int64_t K, int64_t* block) {
  const Entry& e = entry(activation, K);
  const int64_t B = e.gram_block;
  if (B && !block) throw Error("calibration of '" + activation + "' kept only the Gram matrix's diagonal blocks");
  if (block) *block = B;
  if (e.measured) {
    unpack_gram(*e.measured);
    return e.measured->gram;
  }
  return B ? kernels::host_view(DType::kFloat64, {kernels::num_blocks(K, B), B, B}, gram_map(e).data())
           : kernels::host_view(DType::kFloat64, {K, K}, gram_map(e).data());
}

void Calibration::release_gram(const std::string& activation) {
  const auto e = entries_.find(activation);
  if (e == entries_.end() || e->second.measured) return;
  const auto m = maps_.find(e->second.gram);
  if (m != maps_.end()) m->second->release(0, m->second->size());
}

const float* Calibration::token_sample(const std::string& activation, int64_t K, int64_t* rows) {
  const Entry& e = entry(activation, K);
  if (e.measured)
    throw Error("the layer engine keeps no token sample of activation '" + activation +
                "' (ModelOpt's clip search calibrates through ONNX Runtime)");
  if (e.token_sample.empty())
    throw Error("calibration kept no token sample of activation '" + activation + "' (awq_clip, modelopt mode)");
  *rows = e.token_sample_rows;
  if (e.token_sample_rows == 0) return nullptr;
  const MappedFile& m = map(e.token_sample);
  if (m.size() != uint64_t(e.token_sample_rows * K) * 4)
    throw Error("calibration file " + m.path() + " has " + std::to_string(m.size()) + " bytes, expected " +
                std::to_string(e.token_sample_rows * K * 4));
  return reinterpret_cast<const float*>(m.data());
}

std::vector<float> Calibration::gram_f32(const std::string& activation) {
  const Entry& e = entries_.at(activation);
  if (e.gram_block) throw Error("calibration of '" + activation + "' kept only the Gram matrix's diagonal blocks");
  if (e.measured) {
    const double* g = host_gram(*e.measured);
    return std::vector<float>(g, g + e.K * e.K);
  }
  const MappedFile& gram = gram_map(e);
  const double* g = reinterpret_cast<const double*>(gram.data());
  std::vector<float> out(gram.size() / 8);
  for (size_t i = 0; i < out.size(); ++i) out[i] = float(g[i]);
  gram.release(0, gram.size());  // converted: the float64 pages need not stay resident
  return out;
}

ActivationStats Calibration::stats(const std::string& activation, bool numpy_mean) {
  Entry& e = entries_.at(activation);
  ActivationStats s;
  s.K = e.K;
  s.rows = e.rows;
  if (e.gram_block) throw Error("calibration of '" + activation + "' kept only the Gram matrix's diagonal blocks");
  if (e.measured) {
    if (numpy_mean)
      throw Error("the layer engine keeps no numpy mean of activation '" + activation +
                  "' (ModelOpt's statistics come from ONNX Runtime: --calibration_engine ort)");
    unpack_gram(*e.measured);
    s.gram = e.measured->gram.f64();  // null where only the backend holds it: gram_tensor
    e.x_mean.resize(size_t(e.K));
    for (int64_t k = 0; k < e.K; ++k)
      e.x_mean[size_t(k)] = float(e.measured->sum_abs[size_t(k)] / double(std::max<int64_t>(e.rows, 1)));
    s.x_mean = e.x_mean.data();
    return s;
  }
  s.gram = reinterpret_cast<const double*>(gram_map(e).data());
  if (numpy_mean) {
    const MappedFile& m = map(e.mean_np);
    if (m.size() != uint64_t(e.K) * 4) throw Error("calibration file " + m.path() + " has the wrong size");
    s.x_mean = reinterpret_cast<const float*>(m.data());
  } else {
    const MappedFile& m = map(e.sum_abs);
    if (m.size() != uint64_t(e.K) * 8) throw Error("calibration file " + m.path() + " has the wrong size");
    const double* sum = reinterpret_cast<const double*>(m.data());
    e.x_mean.resize(size_t(e.K));
    for (int64_t k = 0; k < e.K; ++k) e.x_mean[size_t(k)] = float(sum[k] / double(std::max<int64_t>(e.rows, 1)));
    s.x_mean = e.x_mean.data();
  }
  return s;
}

std::map<std::string, std::vector<std::vector<float>>> Calibration::numpy_grid(const std::vector<GridItem>& items,
                                                                                const std::vector<double>& alphas,
                                                                                bool per_subgraph) {
  const fs::path dir = fs::path(dir_) / "grid";
  std::error_code ec;
  fs::create_directories(dir, ec);
  nlohmann::json req = {{"alphas", alphas}, {"items", nlohmann::json::array()}};
  if (per_subgraph) req["formula"] = "per_subgraph";
  auto dump = [&](const std::string& name, const std::vector<float>& v) {
    std::ofstream f(dir / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
    if (!f) throw Error("cannot write " + (dir / name).string());
  };
  for (const auto& it : items) {
    dump(it.id + ".x.f32", it.x_mean);
    dump(it.id + ".w.f32", it.w_mean);
    req["items"].push_back(
        {{"id", it.id}, {"x_mean", it.id + ".x.f32"}, {"w_mean", it.id + ".w.f32"}, {"K", it.x_mean.size()}});
  }
  {
    std::ofstream f(dir / "request.json");
    f << req.dump();
  }
  run_capture({"grid", "--request", (dir / "request.json").string(), "--out", dir.string()}, true);
  std::map<std::string, std::vector<std::vector<float>>> out;
  for (const auto& it : items) {
    const size_t K = it.x_mean.size();
    std::ifstream f(dir / (it.id + ".grid.f32"), std::ios::binary);
    std::vector<float> all(K * alphas.size());
    f.read(reinterpret_cast<char*>(all.data()), std::streamsize(all.size() * 4));
    if (!f) throw Error("the numpy scale grid for " + it.id + " is missing or short");
    auto& v = out[it.id];
    for (size_t a = 0; a < alphas.size(); ++a) v.emplace_back(all.begin() + long(a * K), all.begin() + long((a + 1) * K));
  }
  fs::remove_all(dir, ec);
  return out;
}

}  // namespace nibble

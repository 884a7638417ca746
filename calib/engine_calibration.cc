#include "calib/engine_calibration.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>

#include "calib/capture_server.h"
#include "calib/engine_statistics.h"
#include "calib/stats_space.h"
#include "forward/forward_files.h"
#include "loaders/error.h"
#include "loaders/json_file.h"

namespace fs = std::filesystem;

namespace nibble {

namespace {
constexpr const char* kTokenMask = "__token_mask__";  // calib/feeds_dump.py

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

EngineCalibration::EngineCalibration(const CalibrationOptions& o, const std::string& model_path) : quiet_(o.quiet) {
  model_ = OnnxModel::load(model_path);
  graph_ = std::make_unique<forward::GraphRun>(*model_);
  const auto missing = graph_->unsupported();
  if (!missing.empty())
    throw Error("--calibration_engine native: the layer engine cannot run " + model_path + ": " + missing.front() +
                (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "") +
                " (--calibration_engine ort runs it)");
  std::string tmpl = statistics_dir_template(fs::temp_directory_path().string());
  if (!::mkdtemp(tmpl.data())) throw Error("cannot create a temporary folder: " + errno_text(errno));
  feeds_dir_ = tmpl;
  std::vector<std::string> argv = {"feeds", "--model", model_path, "--out", feeds_dir_};
  add_source_args(o, argv);
  run_capture(argv, o.quiet);
  const nlohmann::json top = read_json_file(feeds_dir_ + "/batches.json");
  for (const auto& b : top.at("batches")) batches_.push_back(Batch{feeds_dir_ + "/" + b.at("dir").get<std::string>(), {}, {}, false});
}

EngineCalibration::~EngineCalibration() {
  std::error_code ec;
  if (!feeds_dir_.empty()) fs::remove_all(feeds_dir_, ec);
}

std::map<std::string, forward::Value> EngineCalibration::read_batch_feeds(Batch& b) {
  auto feeds = forward::read_feeds(b.dir);
  const auto mask = feeds.find(kTokenMask);
  if (mask == feeds.end()) throw Error(b.dir + ": the calibration feeds lack their token mask");
  b.token_mask = forward::to_ints(mask->second);
  feeds.erase(mask);
  return feeds;
}

std::unique_ptr<Calibration> EngineCalibration::measure(const std::vector<Calibration::Request>& acts, bool mask_padding,
                                                        const CalibrationExtras& extras) {
  if (extras.sample_tokens > 0)
    throw Error("--calibration_engine native keeps no token sample (ModelOpt's awq_clip): use --calibration_engine ort");
  if (!extras.layer_weights.empty())
    throw Error("--calibration_engine native does not feed quantized layers forward: use --calibration_engine ort");
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> names;
  std::map<std::string, ActivationAccumulator> accs;
  size_t first = graph_->nodes(), end = 0;
  std::map<std::string, int64_t> acts_K;
  for (const auto& a : acts) {
    acts_K[a.name] = a.K;
    const size_t p = graph_->producer(a.name);
    first = std::min(first, p);
    end = std::max(end, p == graph_->nodes() ? size_t(0) : p + 1);
    names.insert(a.name);
    accs.emplace(a.name, ActivationAccumulator(a.K, extras.gram_block));
  }
  const auto t0 = std::chrono::steady_clock::now();
  double stats_s = 0.0;
  int64_t tokens = 0;
  for (Batch& b : batches_) {
    const std::vector<int64_t>* mask = nullptr;
    const forward::GraphRun::Capture fold = [&](const std::string& name, const forward::Value& v) {
      const auto ts = std::chrono::steady_clock::now();
      ActivationAccumulator& acc = accs.at(name);
      const int64_t K = acts_K.at(name);
      if (!v.is_float() || v.shape.empty() || v.shape.back() != K)
        throw Error("activation '" + name + "' is " + dtype_name(v.dtype) + " " + forward::shape_text(v.shape) +
                    ", not [..., " + std::to_string(K) + "] floats");
      const std::vector<float> x = forward::to_floats(forward::narrow(v));
      const int64_t rows = v.numel() / K;
      const bool masked = mask_padding && mask && int64_t(mask->size()) == rows;
      acc.add_rows(x.data(), rows, masked ? mask->data() : nullptr);
      stats_s += since(ts);
    };
    const bool restart = !b.started || b.state.next > first;
    if (restart) {
      auto feeds = read_batch_feeds(b);
      mask = &b.token_mask;
      b.state = graph_->start(feeds, names, fold);
      b.started = true;
    }
    mask = &b.token_mask;
    graph_->advance(b.state, end, names, fold);
    tokens += int64_t(b.token_mask.size());
  }
  graph_->release_weights();  // this group's weights: the next group reads others
  const auto tf = std::chrono::steady_clock::now();
  std::map<std::string, MeasuredActivation> measured;
  for (auto& [name, acc] : accs) measured[name] = acc.finish();
  stats_s += since(tf);
  for (auto& [name, m] : measured) {
    bool finite = true;
    for (double d : m.sum_abs) finite = finite && std::isfinite(d);
    for (double d : m.gram) finite = finite && std::isfinite(d);
    if (!finite)
      throw Error(model_->path() + ": activation '" + name + "' takes non-finite values (inf/nan) on the calibration "
                  "data, so its statistics cannot guide the search");
  }
  const double total = since(t0);
  forward_seconds_ += total - stats_s;
  statistics_seconds_ += stats_s;
  if (!quiet_)
    spdlog::debug("calibration (layer engine): {} activations, {} batches, forward {:.2f} s, statistics {:.2f} s",
                  acts.size(), batches_.size(), total - stats_s, stats_s);
  return Calibration::from_measured(std::move(measured), tokens);
}

}  // namespace nibble

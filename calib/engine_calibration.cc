#include "calib/engine_calibration.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "calib/capture_server.h"
#include "calib/engine_statistics.h"
#include "calib/stats_space.h"
#include "forward/buffer_pool.h"
#include "forward/forward_files.h"
#include "kernels/parallel.h"
#include "loaders/error.h"
#include "loaders/json_file.h"

namespace fs = std::filesystem;

namespace nibble {

namespace {
constexpr const char* kTokenMask = "__token_mask__";  // calib/feeds_dump.py

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// An inf/nan statistic makes every AWQ/clip loss non-finite: the search could only guess.
// XᵀX is checked where it was accumulated (one flag per chunk comes back from a device).
void check_finite(const std::map<std::string, MeasuredActivation>& measured, const std::string& model_path) {
  for (const auto& [name, m] : measured) {
    bool finite = true;
    for (double d : m.sum_abs) finite = finite && std::isfinite(d);
    finite = finite && m.backend->all_finite(m.gram);
    if (!finite)
      throw Error(model_path + ": activation '" + name + "' takes non-finite values (inf/nan) on the calibration "
                  "data, so its statistics cannot guide the search");
  }
}
}  // namespace

namespace {
std::string first_unsupported(const forward::GraphRun& graph) {
  const auto missing = graph.unsupported();
  if (missing.empty()) return "";
  return missing.front() + (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "");
}
}  // namespace

std::string layer_engine_cannot_run(const std::string& model_path) {
  auto model = OnnxModel::load(model_path);
  return first_unsupported(forward::GraphRun(*model));
}

EngineCalibration::EngineCalibration(const CalibrationOptions& o, const std::string& model_path,
                                     kernels::Backend& statistics)
    : options_(o), statistics_(&statistics), quiet_(o.quiet) {
  options_.layer_engine = nullptr;
  model_ = OnnxModel::load(model_path);
  graph_ = std::make_unique<forward::GraphRun>(*model_);
  // On a device the forward runs there too: a layer's activations stay where its statistics are summed.
  if (statistics.transfer_ledger()) graph_->use_backend(&statistics);
  if (const std::string missing = first_unsupported(*graph_); !missing.empty())
    throw Error("--calibration_engine native: the layer engine cannot run " + model_path + ": " + missing +
                " (--calibration_engine ort runs it)");
}

void EngineCalibration::write_feeds() {
  const CalibrationOptions& o = options_;
  const std::string& model_path = model_->path();
  const std::string tmp = fs::temp_directory_path().string();
  sweep_dead_statistics(tmp);  // the feeds live where ONNX Runtime's statistics would: the same sweep
  std::string tmpl = statistics_dir_template(tmp);
  if (!::mkdtemp(tmpl.data())) throw Error("cannot create a temporary folder: " + errno_text(errno));
  feeds_dir_ = tmpl;
  std::vector<std::string> argv = {"feeds", "--model", model_path, "--out", feeds_dir_};
  add_source_args(o, argv);
  run_capture(argv, o.quiet);
  const nlohmann::json top = read_json_file(feeds_dir_ + "/batches.json");
  nlohmann::json chunk_shapes;
  int64_t chunk_rows = 0;
  for (const auto& b : top.at("batches")) {
    const std::string dir = feeds_dir_ + "/" + b.at("dir").get<std::string>();
    nlohmann::json shapes = nlohmann::json::object();  // every input's shape: batches join where they agree
    int64_t rows = 0;
    for (const auto& e : read_json_file(dir + "/index.json")) {
      shapes[e.at("name").get<std::string>()] = e.at("shape");
      if (e.at("name") == kTokenMask) rows = forward::numel_of(e.at("shape").get<std::vector<int64_t>>());
    }
    if (batches_.empty() || shapes != chunk_shapes || chunk_rows + rows > kRowsPerChunk) {
      batches_.push_back(Batch{});
      chunk_shapes = shapes;
      chunk_rows = 0;
    }
    batches_.back().dirs.push_back(dir);
    chunk_rows += rows;
  }
}

std::vector<std::map<std::string, forward::Value>> EngineCalibration::batch_feeds() {
  std::lock_guard<std::mutex> lock(mu_);
  if (feeds_dir_.empty()) write_feeds();
  std::vector<std::map<std::string, forward::Value>> all;
  for (Batch& b : batches_) {
    Batch copy;  // read_batch_feeds sets the batch's token mask: the engine's own batches stay as they are
    copy.dirs = b.dirs;
    all.push_back(read_batch_feeds(copy));
  }
  return all;
}

void EngineCalibration::substitute(const std::string& name, forward::Value v) {
  std::lock_guard<std::mutex> lock(mu_);
  graph_->substitute(name, std::move(v));
}

void EngineCalibration::lend_device_weight(const std::string& name, kernels::Tensor t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (graph_->device()) graph_->lend_device_upload(name, std::move(t));
}

EngineCalibration::~EngineCalibration() {
  std::error_code ec;
  if (!feeds_dir_.empty()) fs::remove_all(feeds_dir_, ec);
}

namespace {
// The values of several batches joined along their first axis (their shapes agree but in it).
forward::Value join_first_axis(const std::vector<const forward::Value*>& parts) {
  const forward::Value& p0 = *parts.front();
  if (parts.size() == 1 || p0.shape.empty()) return p0;
  auto shape = p0.shape;
  shape[0] = 0;
  for (const auto* p : parts) shape[0] += p->shape[0];
  void* out = nullptr;
  forward::Value v = forward::new_value(p0.dtype, shape, &out);
  size_t at = 0;
  for (const auto* p : parts) {
    if (p->bytes()) std::memcpy(static_cast<uint8_t*>(out) + at, p->data, p->bytes());
    at += p->bytes();
  }
  return v;
}
}  // namespace

std::map<std::string, forward::Value> EngineCalibration::read_batch_feeds(Batch& b) {
  std::vector<std::map<std::string, forward::Value>> each;
  for (const auto& dir : b.dirs) {
    each.push_back(forward::read_feeds(dir));
    if (!each.back().count(kTokenMask)) throw Error(dir + ": the calibration feeds lack their token mask");
  }
  std::map<std::string, forward::Value> feeds;
  for (const auto& [name, v] : each.front()) {
    std::vector<const forward::Value*> parts;
    for (const auto& m : each) parts.push_back(&m.at(name));
    feeds[name] = join_first_axis(parts);
  }
  b.token_mask = forward::to_ints(feeds.at(kTokenMask));
  feeds.erase(kTokenMask);
  return feeds;
}

std::unique_ptr<Calibration> EngineCalibration::measure(const std::vector<Calibration::Request>& acts, bool mask_padding,
                                                        const CalibrationExtras& extras) {
  if (extras.sample_tokens > 0)
    throw Error("--calibration_engine native keeps no token sample (ModelOpt's awq_clip): use --calibration_engine ort");
  std::lock_guard<std::mutex> lock(mu_);
  if (feeds_dir_.empty()) write_feeds();  // at the first request: a run refused before it starts none
  const bool feed = !extras.layer_weights.empty();
  std::set<std::string> names;
  std::map<std::string, ActivationAccumulator> accs;
  size_t first = graph_->nodes(), end = 0;
  bool reads_inputs = false;
  std::map<std::string, int64_t> acts_K;
  for (const auto& a : acts) {
    acts_K[a.name] = a.K;
    const size_t p = graph_->producer(a.name);
    reads_inputs = reads_inputs || p == graph_->nodes();  // a graph input: seen only when a batch starts
    first = std::min(first, p);
    end = std::max(end, p == graph_->nodes() ? size_t(0) : p + 1);
    names.insert(a.name);
    accs.emplace(a.name, ActivationAccumulator(*statistics_, a.K, extras.gram_block));
  }
  const kernels::CpuTally cpu;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_log = t0;
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
      const int64_t rows = v.numel() / K;
      const bool masked = mask_padding && mask && int64_t(mask->size()) == rows;
      if (v.on_device()) {
        acc.add_device_rows(v.device, v.wide ? v.dtype : DType::kFloat32, rows, masked ? mask : nullptr);
      } else {
        forward::Floats widened;  // a float32 activation is read in place
        if (v.storage() != DType::kFloat32 || v.wide) forward::rounded_floats_into(v, widened);
        const float* x = widened.empty() ? v.as<float>() : widened.data();
        acc.add_rows(x, rows, masked ? mask->data() : nullptr);
      }
      const int64_t counted = masked ? rows - std::count(mask->begin(), mask->end(), int64_t(0)) : rows;
      statistics_row_bytes_ += uint64_t(counted * K) * sizeof(float);
      stats_s += since(ts);
    };
    if (feed && b.has_group_start && b.group_start.next <= first && !reads_inputs) b.state = b.group_start;
    const bool restart = !b.started || b.state.next > first || reads_inputs;
    if (restart) {
      auto feeds = read_batch_feeds(b);
      mask = &b.token_mask;
      b.state = graph_->start(feeds, names, fold);
      b.started = true;
    }
    mask = &b.token_mask;
    if (feed) {  // the previous group again, now quantized, up to this group's first node
      graph_->advance(b.state, first, {}, {});
      b.group_start = b.state;
      b.has_group_start = true;
    }
    graph_->advance(b.state, end, names, fold);
    tokens += int64_t(b.token_mask.size());
    if (!quiet_ && since(last_log) > 10.0) {  // long work (a whole-model pass, a large layer) says how far it is
      spdlog::info("calibration (layer engine): {} of {} batch runs, {:.0f} s", &b - batches_.data() + 1,
                   batches_.size(), since(t0));
      last_log = std::chrono::steady_clock::now();
    }
  }
  std::map<std::string, kernels::Tensor> uploads = graph_->take_device_uploads();
  graph_->release_weights();  // this group's weights: the next group reads others
  forward::pool_release_idle();
  const auto tf = std::chrono::steady_clock::now();
  std::map<std::string, MeasuredActivation> measured;
  for (auto& [name, acc] : accs) {
    measured[name] = acc.finish();
    statistics_products_.flop += acc.products().flop;
    statistics_products_.seconds += acc.products().seconds;
  }
  stats_s += since(tf);
  check_finite(measured, model_->path());
  const double total = since(t0);
  forward_seconds_ += total - stats_s;
  statistics_seconds_ += stats_s;
  cpu_seconds_ += cpu.seconds();
  if (!quiet_)
    spdlog::debug("calibration (layer engine): {} activations, {} runs of joined batches, forward {:.2f} s, "
                  "statistics {:.2f} s", acts.size(), batches_.size(), total - stats_s, stats_s);
  auto calib = Calibration::from_measured(std::move(measured), tokens);
  calib->give_device_weights(std::move(uploads));
  return calib;
}

}  // namespace nibble

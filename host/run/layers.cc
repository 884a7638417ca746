// Layer by layer (host/run/layers.h): the loop over layer groups and its checkpoint.
#include "host/run/layers.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>

#include "host/algo/layer_learned.h"
#include "host/methods.h"
#include "host/run/layer_sensitivity.h"
#include "host/run/layer_state.h"
#include "host/run/report.h"
#include "calib/calibration.h"
#include "calib/engine_calibration.h"
#include "loaders/durable.h"
#include "loaders/error.h"
#include "loaders/json_file.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

fs::path state_path(const QuantizeOptions& o) { return layer_state_dir(o.output_path); }

std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) s += {d[c >> 4], d[c & 15]};
  return s;
}

std::string unhex(const std::string& s) {
  std::string b;
  for (size_t i = 0; i + 1 < s.size(); i += 2) b += char(std::stoi(s.substr(i, 2), nullptr, 16));
  return b;
}

// The checkpoint after `done` groups: written to a temporary name and renamed, so a kill leaves the
// previous one or this one whole. The writer is flushed first: its data_bytes() are what a resumed run
// must find in the file, and bytes still staged in memory would die with the process.
void write_checkpoint(const QuantizeOptions& o, size_t done, ModelWriter& writer, const Emitted& e) {
  writer.flush();
  nlohmann::json log = nlohmann::json::array();
  for (const auto& b : writer.inline_log()) log.push_back(hex(b));
  const nlohmann::json j = {{"settings", resume_settings(o)}, {"layers_done", done},
                            {"data_bytes", writer.data_bytes()}, {"inline_log", log},
                            {"weights", e.weights}, {"bytes_in", e.bytes_in}, {"bytes_out", e.bytes_out},
                            {"sq_error", e.sq_error}, {"elements", e.elements}};
  write_json_file((state_path(o) / "checkpoint.json").string(), j);
}

void save_scales(const QuantizeOptions& o, size_t g, const Searched& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, c] : s.choices) j[name] = c.scale;  // what placing 1/s needs; the report is kept apart
  write_json_file((state_path(o) / ("scales_" + std::to_string(g) + ".json")).string(), j);
}

void load_scales(const QuantizeOptions& o, size_t g, Searched& s) {
  const fs::path p = state_path(o) / ("scales_" + std::to_string(g) + ".json");
  const nlohmann::json j = read_json_file(p.string());
  for (const auto& [name, c] : j.items()) s.choices[name].scale = c.get<std::vector<float>>();
}

void add(Emitted& total, const Emitted& e) {
  for (const auto& w : e.weights) total.weights.push_back(w);
  total.bytes_in += e.bytes_in;
  total.bytes_out += e.bytes_out;
  total.sq_error += e.sq_error;
  total.elements += e.elements;
  total.zero_point = e.zero_point;
  total.calibrate_seconds += e.calibrate_seconds;
  total.search_seconds += e.search_seconds;
  total.read.add(e.read);
}

template <typename T>
std::string write_raw(const fs::path& dir, const std::string& name, const std::vector<T>& v) {
  write_file_durably((dir / name).string(), v.data(), v.size() * sizeof(T));  // before the checkpoint naming it
  return name;
}

// One quantized weight as calib/layers.py reads it back to run it dequantized (its index entry).
nlohmann::json write_effective(const fs::path& root, size_t g, const PlannedWeight& pw, const kernels::QuantSpec& spec,
                               const kernels::QuantResult& q, const std::vector<float>* s,
                               const std::vector<float>* divisor, size_t k) {
  const std::string sub = "g" + std::to_string(g), base = sub + "/w" + std::to_string(k);
  std::error_code ec;
  fs::create_directories(root / sub, ec);
  nlohmann::json e = {{"name", pw.weight}, {"rows", pw.rows}, {"cols", pw.cols}, {"k_axis", pw.k_axis},
                      {"block", spec.block}, {"bits", spec.bits}, {"zero_point", spec.zero_point}};
  e["codes"] = write_raw(root, base + ".codes", q.codes);
  e["scales"] = write_raw(root, base + ".scales.f32", q.scales);
  if (spec.zero_point) e["zp"] = write_raw(root, base + ".zp.u8", q.zero_points);
  if (s) e["s"] = write_raw(root, base + ".s.f32", *s);
  if (divisor) e["divisor"] = write_raw(root, base + ".div.f32", *divisor);
  return e;
}

// One quantized weight as the layer engine runs it (--calibration_engine native): the codes dequantized by
// the backend, divided by s along K and multiplied by the column divisor along N, in the weight's type —
// what calib/layers.py computes from write_effective's files.
forward::Value effective_value(kernels::Backend& backend, const PlannedWeight& pw, const kernels::QuantSpec& spec,
                               const kernels::QuantResult& q, const std::vector<float>* s,
                               const std::vector<float>* divisor) {
  const kernels::WeightMatrix shape{pw.dtype, nullptr, pw.rows, pw.cols, pw.k_axis};
  const std::vector<uint8_t> bytes = backend.dequantize(shape, spec, q, DType::kFloat32);
  forward::Floats w(bytes.size() / 4);
  std::memcpy(w.data(), bytes.data(), w.size() * 4);
  for (int64_t k = 0; k < shape.K(); ++k)
    for (int64_t n = 0; n < shape.N(); ++n) {
      float& x = w[shape.index(k, n)];
      if (s) x /= (*s)[size_t(k)];
      if (divisor) x *= (*divisor)[size_t(n)];
    }
  return forward::from_floats(pw.dtype, {pw.rows, pw.cols}, std::move(w));
}

fs::path quantized_dir(const QuantizeOptions& o) { return state_path(o) / "quantized"; }

// Group g's dequantization inputs, once no segment still to run reads them.
void drop_effective(const QuantizeOptions& o, size_t g) {
  std::error_code ec;
  fs::remove(quantized_dir(o) / ("eff_" + std::to_string(g) + ".json"), ec);
  fs::remove_all(quantized_dir(o) / ("g" + std::to_string(g)), ec);
}

// What group g's calibration request is: its activations, and the layer-by-layer settings that make the
// calibration process measure only its segment.
struct GroupCalibration {
  std::vector<Calibration::Request> acts;
  Calibration::Extras extras;
  CalibrationOptions copt;
};

GroupCalibration group_calibration(const QuantizeOptions& o, const Plan& plan, size_t g, const std::string& groups_file) {
  GroupCalibration c{activation_requests(plan), search_calibration(o, plan), o.calib};
  c.extras.layer_state = (state_path(o) / "boundary").string();
  c.extras.layer_groups = groups_file;
  c.extras.layer = int(g);
  c.copt.calib_cache.clear();  // each layer's statistics are dropped once it is written
  if (o.feed_quantized) c.extras.layer_weights = quantized_dir(o).string();
  return c;
}

// Group g's statistics, measured while the main thread searches group g - 1 (float layers fed forward:
// group g's boundary is already written), and with `search` its scale search on them as well. Reads only
// `o`, the plan, the model's weights and the files.
struct AheadOfGroup {
  Searched s;
  bool searched = false;
};

AheadOfGroup calibrate_group(const QuantizeOptions& o, OnnxModel& model, const Planned& planned,
                             const std::vector<size_t>& idx, size_t g, const std::string& groups_file,
                             kernels::Backend* search) {
  Planned sub = sub_plan(planned, idx);
  const GroupCalibration c = group_calibration(o, sub.plan, g, groups_file);
  AheadOfGroup a;
  a.s.calib = Calibration::run(c.copt, model.path(), c.acts, /*mask_padding=*/masks_padding(o), c.extras);
  if (search) {
    search_calibrated(o, model, sub, *search, a.s);
    a.searched = true;
  }
  return a;
}

// awq_learned_layer: the next group's scale search runs beside this group's learning (which holds the main
// thread for most of a layer's time), on the CPU backend, where the search leaves nothing behind but its
// scales: no clip search or GPTQ quantizer (they keep the plan), no mixed precision's sweep (it changes the
// plan). Its results are those it gives on the main thread.
bool searches_ahead(const QuantizeOptions& o, const kernels::Backend& backend) {
  return method(o.algo).learns_layers && backend.takes_concurrent_calls() && !o.searches_clip() && !o.uses_gptq() &&
         !mixed_needs_calibration(o);
}

using PendingCalibration = std::future<AheadOfGroup>;

// One group computed: calibrate it alone (or take what `pending` measured beside the previous group),
// start the next group's calibration (`start_next`), search, emit; the scales kept for a resumed run.
// awq_learned_layer's quantizer for group g: its weights learned together where the learner can run their
// layer backwards, else awq_lite's codes (the log and the report say why).
std::unique_ptr<CalibratedQuantizer> layer_quantizer(const QuantizeOptions& o, const Plan& plan, size_t g,
                                                     Calibration& calib, kernels::Backend& backend,
                                                     LayerLearner& learner) {
  std::vector<std::string> names;
  for (const auto& pw : plan.weights) names.push_back(pw.weight);
  const std::string why = learner.cannot_learn(names);
  if (!why.empty())
    spdlog::warn("layer group {}: its rounding is not learned (no reverse pass for {}): awq_lite's codes", g, why);
  return std::make_unique<LayerLearnedQuantizer>(o, calib, backend, why.empty() ? &learner : nullptr, int(g), why);
}

Emitted run_group(const QuantizeOptions& o, OnnxModel& model, const Planned& planned, const std::vector<size_t>& idx,
                  size_t g, const std::string& groups_file, GraphRewriter& rewriter, kernels::Backend& backend,
                  const std::function<void()>& announce, PendingCalibration& pending,
                  const std::function<void()>& start_next, LayerLearner* learner) {
  Planned sub = sub_plan(planned, idx);
  Searched s;
  if (!calibrates_after_pick(o)) {  // RTN with the INT8 set chosen: nothing left to measure
    announce();
    Emitted e = emit_stage(o, model, sub, s, rewriter, backend);
    save_scales(o, g, s);  // none, but a resumed run reads every finished group's
    spdlog::info("layer group {}: {} weights (no calibration: the INT8 set is chosen)", g, idx.size());
    return e;
  }
  GroupCalibration c = group_calibration(o, sub.plan, g, groups_file);
  nlohmann::json quantized = nlohmann::json::array();
  EngineCalibration* engine = o.calib.layer_engine.get();
  const auto t0 = std::chrono::steady_clock::now();
  const bool overlapped = pending.valid();
  bool searched = false;
  if (overlapped) {
    AheadOfGroup a = pending.get();
    s = std::move(a.s);
    searched = a.searched;
  } else {
    s.calib = Calibration::run(c.copt, model.path(), c.acts, /*mask_padding=*/masks_padding(o), c.extras);
  }
  // Overlapped: only the time this thread waited for it (the rest ran beside the previous group's search).
  s.calibrate_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.feed_quantized)
    s.on_quantized = [&](const PlannedWeight& pw, const kernels::QuantSpec& spec, const kernels::QuantResult& q,
                         const std::vector<float>* sp, const std::vector<float>* div) {
      if (engine)
        engine->substitute(pw.weight, effective_value(backend, pw, spec, q, sp, div));
      else
        quantized.push_back(write_effective(quantized_dir(o), g, pw, spec, q, sp, div, quantized.size()));
    };
  announce();  // after the first calibration: bad calibration input fails with its one error line alone
  if (start_next) start_next();
  if (!searched) search_calibrated(o, model, sub, backend, s);
  if (learner) s.quantizer = layer_quantizer(o, sub.plan, g, *s.calib, backend, *learner);
  save_scales(o, g, s);
  Emitted e = emit_stage(o, model, sub, s, rewriter, backend);
  if (o.feed_quantized && !engine) {  // the next layer's inputs, computed through the quantized layers
    write_json_file((quantized_dir(o) / ("eff_" + std::to_string(g) + ".json")).string(), quantized);
    const auto ta = std::chrono::steady_clock::now();
    Calibration::advance(c.copt, model.path(), c.acts, c.extras);
    s.calibrate_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ta).count();
  }
  spdlog::info("layer group {}: {} weights, calibration {:.1f} s{}, search {:.1f} s{}", g, idx.size(),
               s.calibrate_seconds, overlapped ? " waited (measured beside the previous group)" : "",
               s.search_seconds, searched ? " (beside the previous group)" : "");
  e.calibrate_seconds = s.calibrate_seconds;
  e.search_seconds = s.search_seconds;
  return e;
}

}  // namespace

std::vector<std::vector<size_t>> layer_groups(const Plan& plan, std::string* why) {
  std::map<int, std::vector<size_t>> by_layer;  // -1 (no layer) sorts first: moved last below
  std::map<std::string, int> act_layer;         // siblings follow their first weight
  for (size_t i = 0; i < plan.weights.size(); ++i) {
    const auto& pw = plan.weights[i];
    const int l = act_layer.emplace(pw.activation, pw.layer).first->second;
    by_layer[l].push_back(i);
  }
  std::vector<std::vector<size_t>> out;
  for (const auto& [l, idx] : by_layer)
    if (l >= 0) out.push_back(idx);
  if (by_layer.count(-1)) out.push_back(by_layer.at(-1));
  if (out.size() < 2) {
    *why = "the node names number fewer than two layers (layers.N / layer.N / blocks.N / h.N)";
    return {};
  }
  return out;
}

std::string layer_state_dir(const std::string& output_path) {
  const fs::path out = fs::absolute(output_path);
  return (out.parent_path() / ("." + out.filename().string() + ".layers")).string();
}

std::unique_ptr<LayerStateLock> open_layer_state(const QuantizeOptions& o, size_t groups) {
  const fs::path dir = state_path(o);
  std::error_code ec;
  // Every refusal comes before anything is deleted: the output first, as a whole-model run checks it.
  if (!o.force && fs::exists(o.output_path, ec))
    throw Error("output " + o.output_path + " exists (use --force to overwrite)");
  if (o.resume && !fs::is_directory(dir, ec))
    throw Error("--resume: no layer state " + dir.string() + " (nothing to resume; run without --resume)");
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create the layer state folder " + dir.string() + ": " + ec.message());
  auto lock = std::make_unique<LayerStateLock>(dir.string());
  if (!o.resume && !o.force) {
    if (fs::exists(dir / "checkpoint.json", ec)) {
      const nlohmann::json c = read_json_file((dir / "checkpoint.json").string());
      throw Error("a run stopped after " + std::to_string(c.value("layers_done", size_t(0))) + " of " +
                  std::to_string(groups) + " layer groups left its state in " + dir.string() +
                  ": --resume continues it, --force starts over");
    }
    if (fs::exists(dir / "sensitivity_0.json", ec))
      throw Error("a run stopped in its sensitivity sweep left its state in " + dir.string() +
                  ": --resume continues it, --force starts over");
  }
  return lock;
}

namespace {

// A fresh state: everything of an earlier run goes but the lock this run holds.
void clear_state(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != LayerStateLock::kFile) fs::remove_all(e.path(), ec);
  if (ec) throw Error("cannot clear the layer state folder " + dir.string() + ": " + ec.message());
}

// --resume continues only on the inputs the stopped run read: the same model, data and calibration files.
void check_same_inputs(const QuantizeOptions& o, const fs::path& dir) {
  const fs::path p = dir / "inputs.json";
  std::error_code ec;
  const nlohmann::json was = fs::exists(p, ec) ? read_json_file(p.string()) : nlohmann::json();
  if (was != calibration_input_fingerprints(o.calib, o.onnx_path))
    throw Error("--resume: the model, its data or the calibration files differ from those of the stopped run in " +
                dir.string() + ": --force starts over");
}

}  // namespace

ModelWriter::Options layer_writer_options(const QuantizeOptions& o, ModelWriter::Options base) {
  const fs::path dir = state_path(o);
  std::error_code ec;
  base.resumable_data = (dir / "output.data").string();
  if (o.resume && !fs::exists(dir / "checkpoint.json", ec)) {
    // What a sensitivity sweep left is kept for it (its files say their flags); a state of this version
    // also says its inputs.
    if (fs::exists(dir / "inputs.json", ec)) check_same_inputs(o, dir);
    spdlog::info("--resume: no layer was finished; starting at the first");
    return base;
  }
  if (o.resume) {
    const nlohmann::json c = read_resumable_state((dir / "checkpoint.json").string(), o);
    check_same_inputs(o, dir);
    base.resume_bytes = c.at("data_bytes").get<uint64_t>();
    return base;
  }
  clear_state(dir);
  write_json_file((dir / "inputs.json").string(), calibration_input_fingerprints(o.calib, o.onnx_path));
  return base;
}

void remove_layer_state(const QuantizeOptions& o) {
  std::error_code ec;
  fs::remove_all(state_path(o), ec);
}

void remove_layer_state_if_nothing_finished(const QuantizeOptions& o) {
  const fs::path dir = state_path(o);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "checkpoint.json" || n == "mixed.json" || n.rfind("sensitivity_", 0) == 0) return;  // work to resume
  }
  fs::remove_all(dir, ec);
}

Emitted layer_by_layer_stage(const QuantizeOptions& o, OnnxModel& model, Planned& planned,
                             const std::vector<std::vector<size_t>>& groups, GraphRewriter& rewriter,
                             ModelWriter& writer, kernels::Backend& backend, const std::function<void()>& announce_once) {
  bool announced = false;
  const std::function<void()> announce = [&] {
    if (!announced) announce_once();
    announced = true;
  };
  const fs::path dir = state_path(o);
  const std::string groups_file = (dir / "groups.json").string();
  {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& g : groups) {
      nlohmann::json acts = nlohmann::json::array();
      for (const auto& [act, k] : sub_plan(planned, g).plan.siblings) acts.push_back(act);
      j.push_back(acts);
    }
    write_json_file(groups_file, j);
  }
  if (mixed_needs_calibration(o)) {
    announce();  // the sweep says what it does before it calibrates
    choose_int8_layer_by_layer(o, model, planned, groups, groups_file, backend);
  }
  Emitted total;
  size_t first = 0;
  std::error_code ec;
  if (o.resume && fs::exists(dir / "checkpoint.json", ec)) {
    const nlohmann::json c = read_json_file((dir / "checkpoint.json").string());
    first = c.at("layers_done").get<size_t>();
    std::vector<std::string> log;
    for (const auto& h : c.at("inline_log")) log.push_back(unhex(h.get<std::string>()));
    writer.begin_replay(std::move(log));
    for (size_t g = 0; g < first; ++g) {  // laid out again, not computed
      Planned sub = sub_plan(planned, groups[g]);
      Searched s;
      s.replay = true;
      load_scales(o, g, s);
      emit_stage(o, model, sub, s, rewriter, backend);
    }
    writer.end_replay();
    for (const auto& w : c.at("weights")) total.weights.push_back(w);
    total.bytes_in = c.at("bytes_in");
    total.bytes_out = c.at("bytes_out");
    total.sq_error = c.at("sq_error");
    total.elements = c.at("elements");
    announce();
    spdlog::info("--resume: layers 0..{} were finished; continuing at layer group {} of {}", first - 1, first,
                 groups.size());
  }
  // With the float layers fed forward, group g + 1's boundary exists once group g is calibrated, so its
  // statistics are measured (by the calibration process, on a helper thread) while group g is searched and
  // written. Not with --threads 1 (two processes computing at once), nor where the statistics depend on the
  // quantized weights (--feed_quantized). The layer engine (--calibration_engine native) measures on the helper
  // thread in this process, one request at a time, its statistics accumulating on the run's backend: so not
  // beside the search where that backend takes one caller at a time (a device: its streams, memory and
  // ledger are its one caller's), which then measures each group before searching it.
  const bool engine_shares_backend = o.calib.layer_engine && !backend.takes_concurrent_calls();
  const bool could_overlap = !o.feed_quantized && o.threads != 1 && calibrates_after_pick(o) && !engine_shares_backend;
  if (o.calibrate_first && !could_overlap)
    spdlog::warn("--calibrate_first: no effect: this run calibrates each layer group just before its search already "
                 "({})", o.feed_quantized      ? "--feed_quantized"
                         : o.threads == 1      ? "--threads 1"
                         : engine_shares_backend ? "the layer engine on a device"
                                                 : "it calibrates only for the sensitivity sweep");
  const bool overlap = could_overlap && !o.calibrate_first;
  std::unique_ptr<LayerLearner> learner;  // awq_learned_layer: its own engine over the calibration batches
  if (method(o.algo).learns_layers)
    learner = std::make_unique<LayerLearner>(model.path(), o.calib.layer_engine->batch_feeds(), backend,
                                             layer_learning_options(o));
  PendingCalibration pending;
  kernels::Backend* search = overlap && searches_ahead(o, backend) ? &backend : nullptr;
  for (size_t g = first; g < groups.size(); ++g) {
    std::function<void()> start_next;
    if (overlap && g + 1 < groups.size())
      start_next = [&, h = g + 1] {
        pending = std::async(std::launch::async, [&o, &model, &planned, &groups, h, &groups_file, search] {
          return calibrate_group(o, model, planned, groups[h], h, groups_file, search);
        });
      };
    add(total, run_group(o, model, planned, groups[g], g, groups_file, rewriter, backend, announce, pending,
                         start_next, learner.get()));
    write_checkpoint(o, g + 1, writer, total);
    fs::remove_all(dir / "boundary" / ("g" + std::to_string(g)), ec);  // layer g's inputs: no longer needed
    if (g > 0) drop_effective(o, g - 1);
  }
  announce();
  total.zero_point = writes_zero_point(o);  // as emit_stage says
  return total;
}

}  // namespace nibble

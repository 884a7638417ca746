// The sensitivity sweep of a layer-by-layer run (host/run/layer_sensitivity.h).
#include "host/run/layer_sensitivity.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <optional>

#include "host/methods.h"
#include "host/run/layer_state.h"
#include "host/run/layers.h"
#include "host/run/report.h"
#include "loaders/error.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

fs::path state(const QuantizeOptions& o) { return layer_state_dir(o.output_path); }
fs::path errors_file(const QuantizeOptions& o, size_t g) {
  return state(o) / ("sensitivity_" + std::to_string(g) + ".json");
}
fs::path pick_file(const QuantizeOptions& o) { return state(o) / "mixed.json"; }
// Its own boundary folder: the second sweep starts again from the model's inputs in "boundary".
fs::path measure_boundary(const QuantizeOptions& o) { return state(o) / "boundary_sensitivity"; }

// A state file of this sweep, when a stopped run left it; Error when its flags differ.
std::optional<nlohmann::json> load_if_there(const QuantizeOptions& o, const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  return read_resumable_state(p.string(), o);
}

// Layer group g measured: calibrated alone on the float boundary, the 4-bit AWQ search, e4/e8 per weight.
nlohmann::json measure_group(const QuantizeOptions& o, OnnxModel& model, const Planned& planned,
                             const std::vector<size_t>& idx, size_t g, const std::string& groups_file,
                             kernels::Backend& backend) {
  const auto t0 = std::chrono::steady_clock::now();
  const Planned sub = sub_plan(planned, idx);
  Calibration::Extras extras;
  extras.layer_state = measure_boundary(o).string();
  extras.layer_groups = groups_file;
  extras.layer = int(g);
  CalibrationOptions copt = o.calib;
  copt.calib_cache.clear();
  Searched s;
  s.calib = Calibration::run(copt, model.path(), activation_requests(sub.plan), /*mask_padding=*/masks_padding(o),
                             extras);
  const bool awq = o.searches_scales();
  if (awq) search_scales(o, model, sub.plan, backend, s);
  std::vector<double> e4, e8;
  measure_sensitivity(model, sub.plan, *s.calib, o, backend, awq ? &s.choices : nullptr, &e4, &e8);
  nlohmann::json errors = nlohmann::json::object();
  for (size_t k = 0; k < sub.plan.weights.size(); ++k) errors[sub.plan.weights[k].weight] = {e4[k], e8[k]};
  spdlog::info("sensitivity sweep: layer group {}: {} weights measured, {:.1f} s", g, idx.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return {{"settings", resume_settings(o)}, {"errors", errors}};
}

// The pick a stopped run made, set again on the plan.
void restore_pick(const nlohmann::json& j, Planned& planned) {
  planned.mixed.strategy = "sensitivity";
  planned.mixed.summary = j.at("summary");
  int64_t n8 = 0;
  for (auto& pw : planned.plan.weights) {
    const nlohmann::json& w = j.at("per_weight").at(pw.weight);
    planned.mixed.per_weight[pw.weight] = w;
    if (w.at("precision").get<int>() == 8) {
      pw.bits = 8;
      pw.block = -1;
      ++n8;
    }
  }
  spdlog::info("--resume: the INT8 choice of the stopped run ({} of {} weights INT8)", n8, planned.plan.weights.size());
}

}  // namespace

bool calibrates_after_pick(const QuantizeOptions& o) { return method(o.algo).calibrates(); }

void choose_int8_layer_by_layer(const QuantizeOptions& o, OnnxModel& model, Planned& planned,
                                const std::vector<std::vector<size_t>>& groups, const std::string& groups_file,
                                kernels::Backend& backend) {
  planned.mixed.picked = true;
  if (auto j = load_if_there(o, pick_file(o))) return restore_pick(*j, planned);
  spdlog::info("mixed precision by sensitivity, layer by layer: a first sweep measures every layer's weights at 4 "
               "and 8 bits (one more calibration pass per layer, the float layers fed forward), then the INT8 set is "
               "chosen and a second sweep quantizes");
  std::map<std::string, std::pair<double, double>> errors;
  std::error_code ec;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::optional<nlohmann::json> j = load_if_there(o, errors_file(o, g));
    if (j) spdlog::info("--resume: sensitivity sweep: layer group {} was measured", g);
    else write_json_file(errors_file(o, g).string(), *(j = measure_group(o, model, planned, groups[g], g, groups_file,
                                                                            backend)));
    fs::remove_all(measure_boundary(o) / ("g" + std::to_string(g)), ec);  // layer g's inputs: no longer needed
    for (const auto& [name, e] : j->at("errors").items()) errors[name] = {e.at(0).get<double>(), e.at(1).get<double>()};
  }
  fs::remove_all(measure_boundary(o), ec);
  std::vector<double> e4, e8;
  for (const auto& pw : planned.plan.weights) {
    const auto it = errors.find(pw.weight);
    if (it == errors.end()) throw Error("sensitivity sweep: weight " + pw.weight + " was not measured");
    e4.push_back(it->second.first);
    e8.push_back(it->second.second);
  }
  pick_sensitivity(model, planned.plan, o, planned.format, e4, e8, &planned.mixed);
  nlohmann::json per_weight = nlohmann::json::object();
  for (const auto& [name, w] : planned.mixed.per_weight) per_weight[name] = w;
  write_json_file(pick_file(o).string(),
                  {{"settings", resume_settings(o)}, {"per_weight", per_weight}, {"summary", planned.mixed.summary}});
}

}  // namespace nibble

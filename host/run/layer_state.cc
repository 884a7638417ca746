// Shared pieces of the layer-by-layer state (host/run/layer_state.h).
#include "host/run/layer_state.h"

#include <fstream>

#include "host/run/report.h"
#include "loaders/error.h"

namespace nibble {

nlohmann::json resume_settings(const QuantizeOptions& o) {
  nlohmann::json j = options_to_json(o);
  for (const char* k : {"resume", "force", "report", "quiet", "verbose", "threads", "config"}) j.erase(k);
  return j;
}

nlohmann::json read_state_json(const std::string& path) {
  std::ifstream f(path);
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception&) {
    throw Error("cannot resume: " + path + " is not readable JSON");
  }
}

nlohmann::json read_resumable_state(const std::string& path, const QuantizeOptions& o) {
  nlohmann::json j = read_state_json(path);
  if (!j.contains("settings") || j.at("settings") != resume_settings(o))
    throw Error("--resume: " + path + " was written with other flags; give the same flags or run without --resume");
  return j;
}

Planned sub_plan(const Planned& all, const std::vector<size_t>& idx) {
  Planned p;
  p.format = all.format;
  p.mixed = all.mixed;
  for (size_t i : idx) p.plan.weights.push_back(all.plan.weights[i]);
  for (size_t k = 0; k < p.plan.weights.size(); ++k) p.plan.siblings[p.plan.weights[k].activation].push_back(k);
  return p;
}

std::vector<Calibration::Request> activation_requests(const Plan& plan) {
  std::vector<Calibration::Request> acts;
  for (const auto& [act, k] : plan.siblings) acts.push_back({act, plan.weights[k[0]].K()});
  return acts;
}

}  // namespace nibble

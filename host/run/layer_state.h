// What the layer-by-layer files (host/run/layers.cc, host/run/layer_sensitivity.cc) share about the
// state folder and the layer groups.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host/run/stages.h"

namespace nibble {

// Keeps two runs out of one state folder: an exclusive flock(2) on DIR/lock, held for the run's life
// and dropped by the kernel when the process ends, however it ends (no stale lock after a kill).
class LayerStateLock {
 public:
  // Throws Error (one line, naming the other run's pid) when a live run holds it.
  explicit LayerStateLock(const std::string& dir);
  ~LayerStateLock();
  LayerStateLock(const LayerStateLock&) = delete;
  LayerStateLock& operator=(const LayerStateLock&) = delete;
  static constexpr const char* kFile = "lock";

 private:
  int fd_ = -1;
};

// What must be equal for a stopped run's state to be continued: every flag that can change the output.
nlohmann::json resume_settings(const QuantizeOptions& o);

// A state file of a stopped run, read back for --resume; Error (one line) when it is not JSON
// (read_json_file) or its "settings" are not this run's (resume_settings).
nlohmann::json read_resumable_state(const std::string& path, const QuantizeOptions& o);

// The plan of one group: its weights (plan order) and their siblings, with the run's format and picks.
Planned sub_plan(const Planned& all, const std::vector<size_t>& idx);

// The calibration requests of a plan: one per activation, with its K.
std::vector<Calibration::Request> activation_requests(const Plan& plan);

}  // namespace nibble

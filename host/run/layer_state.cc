// Shared pieces of the layer-by-layer state (host/run/layer_state.h).
#include "host/run/layer_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "host/run/report.h"
#include "loaders/error.h"
#include "loaders/json_file.h"

namespace nibble {

LayerStateLock::LayerStateLock(const std::string& dir) {
  const std::string path = dir + "/" + kFile;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open the layer state lock " + path + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw Error("cannot lock the layer state " + path + ": " + std::strerror(err));
    const std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string("?");
    throw Error("another nibble run (pid " + pid.substr(0, pid.find_first_of("\n ")) + ") is using the layer state " +
                dir + ": wait for it to finish or give another --output_path");
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
    spdlog::debug("layer state lock {}: could not record this run's pid", path);  // the lock itself holds
}

LayerStateLock::~LayerStateLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

nlohmann::json resume_settings(const QuantizeOptions& o) {
  nlohmann::json j = options_to_json(o);
  // layer_by_layer: auto and on run the same layers and write the same bytes, so either resumes the other;
  // calibrate_first changes when a group is calibrated, not what it measures.
  for (const char* k : {"resume", "force", "report", "quiet", "verbose", "threads", "config", "layer_by_layer",
                        "calibrate_first"})
    j.erase(k);
  return j;
}

nlohmann::json read_resumable_state(const std::string& path, const QuantizeOptions& o) {
  nlohmann::json j = read_json_file(path);
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

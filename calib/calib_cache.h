// A --calib_cache folder: calibration statistics kept between runs, one entry per set of settings.
//
//   DIR/<key>/                    a complete entry: capture.py's files + settings.json + manifest.json
//   DIR/<key>.lock                flock'ed: exclusive while the entry is checked or written, shared while
//                                 a run reads it
//   DIR/.<key>.tmp-<owner>/       an entry being written (owner: pid, boot id, start time)
//
// <key> is the XXH64 of the settings. An entry is written under its temporary name, its files and
// folder fsynced, and renamed complete: a kill at any moment leaves either no entry or a whole one.
// A run that finds an entry checks it (settings equal to its own, every file of the manifest there with
// its size) and otherwise says in one line why it is not used and writes it again. Two runs that need
// the same entry take turns on its lock: the second reuses what the first wrote. Once a new entry is
// committed, older entries that no run holds are removed (the cache keeps what was last used).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace nibble {

class CalibCache {
 public:
  // Creates the folder if needed and takes the exclusive lock of the entry for `settings` (waiting,
  // with one line, while another run holds it). Throws Error.
  CalibCache(const std::string& dir, const nlohmann::json& settings);
  ~CalibCache();
  CalibCache(const CalibCache&) = delete;
  CalibCache& operator=(const CalibCache&) = delete;

  // The complete entry's folder for these settings, the lock then shared for as long as this object
  // lives; "" when there is none (said in one line: empty, not reused and why, or torn), the lock kept
  // exclusive for begin_write/commit.
  std::string reusable();
  // A fresh temporary folder to write the entry's statistics into (dead runs' temporaries removed).
  std::string begin_write();
  // Adds settings.json and manifest.json, fsyncs, renames the temporary folder into place and returns
  // the entry's folder; the lock becomes shared. Removes older entries no run holds. Throws Error.
  std::string commit();

  // The cache's key of a set of settings (16 hex digits).
  static std::string key_of(const nlohmann::json& settings);

 private:
  std::string dir_, key_, tmp_;
  nlohmann::json settings_;
  int lock_fd_ = -1;
  std::string entry_path() const;
  void lock_exclusive();
  void share_lock();
  void remove_stale_temporaries() const;
  void remove_unused_entries() const;
  std::string why_not_reused() const;
};

// What differs between an entry's settings and a run's (top-level keys, and input files by name), for
// the log.
std::string settings_diff(const nlohmann::json& old, const nlohmann::json& now);

}  // namespace nibble

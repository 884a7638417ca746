#include "calib/calib_cache.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <vector>

#include "loaders/content_hash.h"
#include "loaders/durable.h"
#include "loaders/error.h"
#include "loaders/json_file.h"
#include "loaders/kill_point.h"
#include "loaders/owner.h"

namespace fs = std::filesystem;

namespace nibble {

namespace {

constexpr const char* kTmpTag = ".tmp-";

bool is_key(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool same_file(int fd, const fs::path& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int flock_retry(int fd, int op) {
  int rc;
  while ((rc = ::flock(fd, op)) != 0 && errno == EINTR) {
  }
  return rc;
}

// Opens and flocks `lock` with `op`; the file must still be the one at its path once locked (a run
// removing an entry unlinks its lock file while holding it). -1 when a non-blocking lock is refused.
int open_locked(const fs::path& lock, int op) {
  for (;;) {
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot open " + lock.string() + ": " + errno_text(errno));
    if (flock_retry(fd, op) != 0) {
      const int e = errno;
      ::close(fd);
      if (e == EWOULDBLOCK) return -1;
      throw Error("cannot lock " + lock.string() + ": " + errno_text(e));
    }
    if (same_file(fd, lock)) return fd;
    ::close(fd);
  }
}

// Why an entry cannot be used for `settings`; "" when it can. A file that cannot be read or is not JSON
// is a defect too, said as read_json_file says it.
std::string entry_defect(const fs::path& entry, const nlohmann::json& settings) try {
  const nlohmann::json own = read_json_file((entry / "settings.json").string());
  if (own != settings) return "its settings are not this run's (different: " + settings_diff(own, settings) + ")";
  const nlohmann::json manifest = read_json_file((entry / "manifest.json").string());
  if (!manifest.is_object() || !manifest.contains("files")) return "its manifest.json lists no files";
  std::error_code ec;
  for (const auto& [name, size] : manifest["files"].items()) {
    const auto have = fs::file_size(entry / name, ec);
    if (ec) return name + " is missing";
    if (!size.is_number_unsigned() || have != size.get<uint64_t>())
      return name + " is " + std::to_string(have) + " bytes, the manifest says " + size.dump();
  }
  read_json_file((entry / "index.json").string());
  return "";
} catch (const Error& e) {
  return e.what();
}

}  // namespace

std::string settings_diff(const nlohmann::json& old, const nlohmann::json& now) {
  std::string d;
  auto add = [&](const std::string& s) { d += (d.empty() ? "" : ", ") + s; };
  for (const auto& [k, v] : now.items()) {
    if (!old.is_object() || !old.contains(k)) {
      add(k);
    } else if (k == "files" && old[k].is_object()) {
      for (const auto& [f, fp] : v.items())
        if (!old[k].contains(f) || old[k][f] != fp) add(f);
      for (const auto& [f, fp] : old[k].items())
        if (!v.contains(f)) add(f);
    } else if (old[k] != v) {
      add(k);
    }
  }
  return d.empty() ? "an unreadable settings.json" : d;
}


std::string CalibCache::key_of(const nlohmann::json& settings) {
  ContentHash h;
  const std::string text = settings.dump();
  h.update(text.data(), text.size());
  return h.hex();
}

CalibCache::CalibCache(const std::string& dir, const nlohmann::json& settings)
    : dir_(fs::absolute(dir).string()), key_(key_of(settings)), settings_(settings) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw Error("cannot create --calib_cache folder " + dir_ + ": " + ec.message());
  lock_exclusive();
}

CalibCache::~CalibCache() {
  std::error_code ec;
  if (!tmp_.empty()) fs::remove_all(tmp_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string CalibCache::entry_path() const { return (fs::path(dir_) / key_).string(); }

void CalibCache::lock_exclusive() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
  const fs::path lock = fs::path(dir_) / (key_ + ".lock");
  lock_fd_ = open_locked(lock, LOCK_EX | LOCK_NB);
  if (lock_fd_ >= 0) return;
  spdlog::info("--calib_cache {}: waiting for another nibble run using the same entry", dir_);
  lock_fd_ = open_locked(lock, LOCK_EX);
}

void CalibCache::share_lock() {
  if (flock_retry(lock_fd_, LOCK_SH) != 0) throw Error("cannot lock --calib_cache entry: " + errno_text(errno));
}

std::string CalibCache::reusable() {
  const fs::path entry = entry_path();
  std::error_code ec;
  if (!fs::exists(entry, ec)) {
    spdlog::info("--calib_cache {}: {}", dir_, why_not_reused());
    return "";
  }
  const std::string defect = entry_defect(entry, settings_);
  if (!defect.empty()) {
    spdlog::info("--calib_cache {}: entry {} not used ({}), calibrating again", dir_, key_, defect);
    fs::remove_all(entry, ec);
    if (ec) throw Error("cannot remove " + entry.string() + ": " + ec.message());
    return "";
  }
  share_lock();
  // Converting the lock is not atomic: if an older-entry sweep of another run took it in between, the
  // entry is gone and is written again.
  if (!fs::exists(entry / "manifest.json", ec)) {
    lock_exclusive();
    spdlog::info("--calib_cache {}: entry {} was removed by another run, calibrating again", dir_, key_);
    return "";
  }
  spdlog::info("--calib_cache {}: reusing its statistics (same model, data and settings)", dir_);
  return entry.string();
}

std::string CalibCache::why_not_reused() const {
  std::error_code ec;
  if (fs::exists(fs::path(dir_) / "index.json", ec))
    return "holds statistics of an older nibble (index.json at its top: not used, remove them to free the "
           "space); calibrating";
  fs::path newest;
  fs::file_time_type newest_time{};
  for (const auto& d : fs::directory_iterator(dir_, ec)) {
    const std::string name = d.path().filename().string();
    if (!is_key(name) || !d.is_directory(ec)) continue;
    const auto t = fs::last_write_time(d.path(), ec);
    if (newest.empty() || t > newest_time) newest = d.path(), newest_time = t;
  }
  if (newest.empty()) return "empty, calibrating";
  try {
    const nlohmann::json old = read_json_file((newest / "settings.json").string());
    return "not reused, calibrating again (different: " + settings_diff(old, settings_) + ")";
  } catch (const Error& e) {
    return std::string("not reused, calibrating again (") + e.what() + ")";
  }
}

std::string CalibCache::begin_write() {
  remove_stale_temporaries();
  tmp_ = (fs::path(dir_) / ("." + key_ + kTmpTag + owner_tag(current_owner()))).string();
  std::error_code ec;
  fs::remove_all(tmp_, ec);
  fs::create_directory(tmp_, ec);
  if (ec) throw Error("cannot create " + tmp_ + ": " + ec.message());
  return tmp_;
}

std::string CalibCache::commit() {
  const fs::path tmp(tmp_);
  write_file_durably((tmp / "settings.json").string(), settings_.dump());
  nlohmann::json files = nlohmann::json::object();
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(tmp)) {
    if (!f.is_regular_file(ec)) continue;
    files[f.path().filename().string()] = uint64_t(f.file_size());
    sync_file(f.path().string());
  }
  write_file_durably((tmp / "manifest.json").string(), nlohmann::json{{"files", files}}.dump(1));
  sync_folder(tmp_);
  kill_point("calib_cache_complete");
  const std::string entry = entry_path();
  rename_durably(tmp_, entry);
  tmp_.clear();
  kill_point("calib_cache_renamed");
  share_lock();
  remove_unused_entries();
  return entry;
}

// Under this entry's exclusive lock; a temporary is removed only when its owner is dead (a run of
// another entry may be writing its own).
void CalibCache::remove_stale_temporaries() const {
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(dir_, ec)) {
    const std::string name = d.path().filename().string();
    const auto pos = name.find(kTmpTag);
    if (name.empty() || name[0] != '.' || pos == std::string::npos || !is_key(name.substr(1, pos - 1))) continue;
    Owner owner;
    if (parse_owner_tag(name.substr(pos + std::char_traits<char>::length(kTmpTag)), &owner) && owner_alive(owner))
      continue;
    fs::remove_all(d.path(), ec);
  }
}

// Other entries (and lock files left without one) that no run holds: each removed under its exclusive
// lock, its lock file unlinked last.
void CalibCache::remove_unused_entries() const {
  std::error_code ec;
  std::vector<std::string> keys;
  for (const auto& d : fs::directory_iterator(dir_, ec)) {
    std::string name = d.path().filename().string();
    if (name.size() == 21 && name.compare(16, 5, ".lock") == 0) name.resize(16);
    if (is_key(name) && name != key_ && std::find(keys.begin(), keys.end(), name) == keys.end()) keys.push_back(name);
  }
  for (const auto& k : keys) {
    const fs::path lock = fs::path(dir_) / (k + ".lock");
    const int fd = open_locked(lock, LOCK_EX | LOCK_NB);
    if (fd < 0) continue;  // in use
    fs::remove_all(fs::path(dir_) / k, ec);
    if (!ec) ::unlink(lock.c_str());
    ::close(fd);
  }
}

}  // namespace nibble

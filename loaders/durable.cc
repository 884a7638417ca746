#include "loaders/durable.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loaders/error.h"

namespace nibble {

namespace {

std::atomic<int64_t> g_fsync_ns{0};

// fsync, its time counted (the cost of durability, in the report).
int timed_fsync(int fd) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = ::fsync(fd);
  const int e = errno;
  g_fsync_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  errno = e;
  return rc;
}

}  // namespace

double fsync_seconds() { return double(g_fsync_ns.load()) * 1e-9; }

void sync_file(int fd, const std::string& what) {
  if (timed_fsync(fd) != 0) throw Error("writing " + what + ": " + errno_text(errno));
}

namespace {
void sync_path(const std::string& path, int flags, const std::string& what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  // A folder one may write in but not list cannot be opened to be synced: its renames are as durable as
  // the filesystem makes them, and that is no reason to fail a run.
  if (fd < 0 && (flags & O_DIRECTORY) && errno == EACCES) return;
  if (fd < 0) throw Error("cannot open " + path + ": " + errno_text(errno));
  const int rc = timed_fsync(fd), e = errno;
  ::close(fd);
  // Some filesystems cannot fsync a folder (EINVAL): nothing more can be done there.
  if (rc != 0 && !(e == EINVAL && (flags & O_DIRECTORY))) throw Error("writing " + what + ": " + errno_text(e));
}
}  // namespace

void sync_file(const std::string& path) { sync_path(path, O_RDONLY, path); }

void sync_folder(const std::string& dir) { sync_path(dir, O_RDONLY | O_DIRECTORY, "folder " + dir); }

void rename_over(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw Error("cannot rename " + from + " to " + to + ": " + errno_text(errno));
}

void rename_durably(const std::string& from, const std::string& to) {
  rename_over(from, to);
  sync_folder(std::filesystem::absolute(to).parent_path().string());
}

void write_durably(const std::string& path, const std::function<void(const std::string& tmp)>& fill) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".nibble-part";
  try {
    fill(tmp);
    sync_file(tmp);
    rename_over(tmp, path);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error("cannot write " + path + ": " + e.what());
  }
  const fs::path dir = fs::absolute(path).parent_path();
  sync_folder(dir.string());
}

void write_file_durably(const std::string& path, const void* data, size_t n) {
  write_durably(path, [&](const std::string& tmp) {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(data), std::streamsize(n));
    f.close();
    if (!f) throw Error(errno_text(errno));
  });
}

}  // namespace nibble

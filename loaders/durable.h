// fsync helpers for writing files that must survive a crash of the machine, not only of the process:
// a file is fsynced before it is renamed into place (else the new name may point at blocks never
// written), and its folder after (else the rename itself may be lost).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace nibble {

// fsync(fd); throws Error naming `what` on failure.
void sync_file(int fd, const std::string& what);
// Opens `path`, fsyncs it and closes it; throws Error on failure.
void sync_file(const std::string& path);
// fsync of the folder; throws Error on failure.
void sync_folder(const std::string& dir);

// Writes `path` so that a crash of the process or the machine at any moment leaves the old file or the
// whole new one, never a part: `fill` writes the temporary PATH.nibble-part, which is fsynced and renamed
// over `path`, then the folder is fsynced. On any failure the temporary is removed and Error names `path`.
void write_durably(const std::string& path, const std::function<void(const std::string& tmp)>& fill);
// rename(2) of `from` over `to`; throws Error naming both. Durable only once their folder is synced:
// rename_durably does both.
void rename_over(const std::string& from, const std::string& to);
void rename_durably(const std::string& from, const std::string& to);

// write_durably with `n` bytes from `data`.
void write_file_durably(const std::string& path, const void* data, size_t n);
inline void write_file_durably(const std::string& path, const std::string& text) {
  write_file_durably(path, text.data(), text.size());
}

// Seconds this process has spent in fsync so far (the report's summary.fsync_seconds).
double fsync_seconds();

}  // namespace nibble

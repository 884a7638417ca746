// fsync helpers for writing files that must survive a crash of the machine, not only of the process:
// a file is fsynced before it is renamed into place (else the new name may point at blocks never
// written), and its folder after (else the rename itself may be lost).
#pragma once
#include <string>

namespace nibble {

// fsync(fd); throws Error naming `what` on failure.
void sync_file(int fd, const std::string& what);
// Opens `path`, fsyncs it and closes it; throws Error on failure.
void sync_file(const std::string& path);
// fsync of the folder; throws Error on failure.
void sync_folder(const std::string& dir);

// Seconds this process has spent in fsync so far (the report's summary.fsync_seconds).
double fsync_seconds();

}  // namespace nibble

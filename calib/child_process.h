// Starting a child process and reading what it says on stderr: the one mechanism behind run_child (a
// process per command) and the calibration process of a run (capture_server.cc).
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace nibble {

// Starts argv[0] (found on PATH) with `fds`: each (parent's descriptor, the child's number for it); the
// parent's descriptors stay open. Throws Error naming the program when it cannot be run.
pid_t spawn_child(const std::vector<std::string>& argv, const std::vector<std::pair<int, int>>& fds);

// A child's stderr, line by line: passed through to nibble's stderr (unless quiet), except lines starting
// with `error_prefix`, which nibble prints as its own error line (the last one is kept), and the last
// other line kept for a failure without one.
struct ChildStderr {
  ChildStderr(std::string prefix, bool quiet_) : error_prefix(std::move(prefix)), quiet(quiet_) {}
  std::string error_prefix;
  bool quiet = false;
  std::string pending, last_error, last_line;
  void take(const char* buf, size_t n);
};

// "exit N" or "signal N", from a waitpid status.
std::string exit_text(int status);

}  // namespace nibble

#include "calib/child_process.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>

#include "loaders/error.h"

extern char** environ;

namespace nibble {

pid_t spawn_child(const std::vector<std::string>& argv, const std::vector<std::pair<int, int>>& fds) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  for (const auto& [from, to] : fds) posix_spawn_file_actions_adddup2(&fa, from, to);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    throw Error("cannot run " + argv[0] + ": " + errno_text(rc) +
                " (set NIBBLE_PYTHON to a Python with nibble's requirements)");
  return pid;
}

void ChildStderr::take(const char* buf, size_t n) {
  pending.append(buf, n);
  for (size_t pos; (pos = pending.find('\n')) != std::string::npos;) {
    const std::string line = pending.substr(0, pos);
    pending.erase(0, pos + 1);
    if (line.rfind(error_prefix, 0) == 0) {
      last_error = line;  // nibble prints it as its own error line
      continue;
    }
    if (!line.empty()) last_line = line;
    if (!quiet) std::fprintf(stderr, "%s\n", line.c_str());
  }
}

std::string exit_text(int status) {
  return WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                           : "signal " + std::to_string(WTERMSIG(status));
}

}  // namespace nibble

#include "calib/capture_server.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>

#include "calib/calibration.h"
#include "calib/child_process.h"
#include "loaders/error.h"


namespace nibble {
namespace {

constexpr const char* kErrorPrefix = "calibration: ";
std::atomic<int> g_started{0};

bool server_enabled() {
  const char* v = std::getenv("NIBBLE_CALIB_SERVER");
  return !(v && std::strcmp(v, "0") == 0);
}

class CaptureServer {
 public:
  ~CaptureServer() { stop(); }

  void run(const std::vector<std::string>& args, bool quiet) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // it ended between requests: a new one
      pid_ = -1;
      reap();
    }
    if (pid_ < 0) start();
    if (!send(nlohmann::json(args).dump() + "\n")) {
      ChildStderr err{kErrorPrefix, quiet};
      died(err);  // it stopped taking requests: why, from its stderr and its status
    }
    ChildStderr err{kErrorPrefix, quiet};
    std::string reply;
    bool err_open = true;  // stderr at its end (the child is gone): only the reply pipe is watched
    while (reply.find('\n') == std::string::npos) {
      pollfd fds[2] = {{err_open ? err_fd_ : -1, POLLIN, 0}, {reply_fd_, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        throw Error("poll: " + errno_text(errno));
      }
      char buf[4096];
      if (fds[0].revents) {  // stderr first: what the child said before it replied
        const ssize_t n = ::read(err_fd_, buf, sizeof buf);
        if (n > 0) err.take(buf, size_t(n));
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) err_open = false;
        continue;
      }
      const ssize_t n = ::read(reply_fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return died(err);
      reply.append(buf, size_t(n));
    }
    drain(err);
    const int rc = std::atoi(reply.c_str());
    if (rc == 0) return;
    if (!err.last_error.empty()) throw Error(err.last_error);
    throw Error("calib/capture.py failed (exit " + std::to_string(rc) +
                (err.last_line.empty() ? "" : ": " + err.last_line) + ")");
  }

 private:
  std::mutex mutex_;
  pid_t pid_ = -1;
  int in_fd_ = -1, err_fd_ = -1, reply_fd_ = -1;

  // The request line to the child's stdin. SIGPIPE (a child that died) is blocked in this thread for the
  // write and taken back afterwards, so a dead child is an error here, not the end of nibble.
  bool send(const std::string& s) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    size_t off = 0;
    bool ok = true;
    while (off < s.size()) {
      const ssize_t n = ::write(in_fd_, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;
        break;
      }
      off += size_t(n);
    }
    if (!ok) {
      const timespec none{0, 0};
      sigtimedwait(&pipe_set, nullptr, &none);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return ok;
  }

  // PR_SET_PDEATHSIG (capture.py's) follows the thread that started the child: nibble's first calibration
  // runs on its main thread, which lives as long as the run (later requests may come from a helper thread;
  // a child started there ends with that thread, and the next request starts another).
  void start() {
    int in[2], err[2], rep[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(rep, O_CLOEXEC) != 0)
      throw Error("pipe: " + errno_text(errno));
    pid_t pid = 0;
    try {
      pid = spawn_child({python_executable(), capture_script(), "serve"}, {{in[0], 0}, {err[1], 2}, {rep[1], 3}});
    } catch (...) {
      for (int fd : {in[0], in[1], err[0], err[1], rep[0], rep[1]}) ::close(fd);
      throw;
    }
    for (int fd : {in[0], err[1], rep[1]}) ::close(fd);
    pid_ = pid, in_fd_ = in[1], err_fd_ = err[0], reply_fd_ = rep[0];
    ++g_started;
  }

  // What is left on stderr once the reply came (written before it).
  void drain(ChildStderr& err) {
    const int flags = ::fcntl(err_fd_, F_GETFL);
    ::fcntl(err_fd_, F_SETFL, flags | O_NONBLOCK);
    char buf[4096];
    for (ssize_t n; (n = ::read(err_fd_, buf, sizeof buf)) > 0;) err.take(buf, size_t(n));
    ::fcntl(err_fd_, F_SETFL, flags);
  }

  [[noreturn]] void died(ChildStderr& err) {
    const int flags = ::fcntl(err_fd_, F_GETFL);
    ::fcntl(err_fd_, F_SETFL, flags & ~O_NONBLOCK);
    char buf[4096];
    for (ssize_t n; (n = ::read(err_fd_, buf, sizeof buf)) > 0;) err.take(buf, size_t(n));
    const int status = reap();
    if (!err.last_error.empty()) throw Error(err.last_error);
    throw Error("calib/capture.py stopped (" + exit_text(status) + (err.last_line.empty() ? "" : ": " + err.last_line) +
                ")");
  }

  int reap() {
    for (int fd : {in_fd_, err_fd_, reply_fd_})
      if (fd >= 0) ::close(fd);
    in_fd_ = err_fd_ = reply_fd_ = -1;
    int status = 0;
    if (pid_ > 0)
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    pid_ = -1;
    return status;
  }

  // End of the run: stdin closed, the child ends its loop and exits.
  void stop() {
    if (pid_ < 0) return;
    reap();
  }
};

CaptureServer& server() {
  static CaptureServer s;
  return s;
}

}  // namespace

void run_capture(const std::vector<std::string>& args, bool quiet) {
  if (!server_enabled()) {
    std::vector<std::string> argv = {python_executable(), capture_script()};
    argv.insert(argv.end(), args.begin(), args.end());
    ++g_started;
    return run_child(argv, kErrorPrefix, quiet);
  }
  server().run(args, quiet);
}

int capture_processes_started() { return g_started.load(); }

}  // namespace nibble

#include "host/run/progress.h"

#include <unistd.h>

#include <cstdio>

namespace nibble {

Progress::Progress(int64_t total_items, uint64_t total_bytes, bool enabled)
    : total_(total_items), total_bytes_(total_bytes), enabled_(enabled), tty_(::isatty(2) != 0),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::step(const std::string& line, uint64_t bytes) {
  ++done_;
  done_bytes_ += bytes;
  if (!enabled_) return;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? double(done_bytes_) / secs : 0;
  if (tty_) {
    const int width = 30;
    const double frac = total_bytes_ ? double(done_bytes_) / double(total_bytes_) : double(done_) / double(total_);
    const int fill = int(frac * width + 0.5);
    std::string bar(size_t(fill), '#');
    bar.resize(size_t(width), '.');
    const double eta = rate > 0 ? double(total_bytes_ - done_bytes_) / rate : 0;
    std::fprintf(stderr, "\r\033[K[%s] %3d%% %lld/%lld  %s/s  eta %.0fs  %s", bar.c_str(), int(frac * 100),
                 static_cast<long long>(done_), static_cast<long long>(total_), human_bytes(uint64_t(rate)).c_str(),
                 eta, line.substr(0, 60).c_str());
  } else {
    std::fprintf(stderr, "[%*lld/%lld] %s\n", int(std::to_string(total_).size()), static_cast<long long>(done_),
                 static_cast<long long>(total_), line.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && tty_ && done_ > 0) std::fprintf(stderr, "\n");
}

}  // namespace nibble

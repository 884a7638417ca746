// Progress of a long run on stderr: a redrawn bar on a terminal, one plain line per item
// otherwise (logs, CI), nothing with --quiet.
#pragma once
#include "host/text.h"
#include <chrono>
#include <cstdint>
#include <string>

namespace nibble {

class Progress {
 public:
  Progress(int64_t total_items, uint64_t total_bytes, bool enabled);
  ~Progress();
  // One item done; `line` describes it (shape, dtype -> target, sizes).
  void step(const std::string& line, uint64_t bytes);
  void finish();

 private:
  int64_t total_, done_ = 0;
  uint64_t total_bytes_, done_bytes_ = 0;
  bool enabled_, tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_;
};


}  // namespace nibble

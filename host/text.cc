#include "host/text.h"

#include <cstdio>

namespace nibble {

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(n) / double(1ull << 30));
  else if (n >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(1ull << 20));
  else if (n >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(n) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

}  // namespace nibble

#include "loaders/error.h"

#include <cstdio>
#include <cstring>

namespace nibble {

std::string one_line(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\0': out += "\\0"; break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", u);
        out += buf;
      }
    }
  }
  return out;
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace nibble

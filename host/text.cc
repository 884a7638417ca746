#include "host/text.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "loaders/error.h"

namespace nibble {

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(n) / double(1ull << 30));
  else if (n >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(1ull << 20));
  else if (n >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(n) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

uint64_t parse_size(const std::string& s, const std::string& flag) {
  const char* begin = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  std::string unit;
  for (const char* p = end; p && *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p))) unit += char(std::toupper(static_cast<unsigned char>(*p)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  const std::string units = "KMGT";
  const size_t u = unit.empty() || unit == "B" ? std::string::npos : units.find(unit);
  if (end == begin || !std::isfinite(v) || v <= 0 || (!unit.empty() && unit != "B" && (unit.size() != 1 || u == std::string::npos)))
    throw Error(flag + " '" + s + "' is not a size (for example 1GiB, 512MiB or a byte count)");
  const double bytes = v * std::pow(1024.0, u == std::string::npos ? 0.0 : double(u + 1));
  if (bytes >= 1.8e19) throw Error(flag + " '" + s + "' is too large");
  return uint64_t(bytes);
}

}  // namespace nibble

#include "host/text.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

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
  // SI names are powers of 1000, IEC names (with an i) powers of 1024; a lone letter is the SI prefix.
  static const std::map<std::string, double> units = {
      {"", 1.0},  {"b", 1.0},
      {"k", 1e3}, {"kb", 1e3},   {"ki", 1024.0},          {"kib", 1024.0},
      {"m", 1e6}, {"mb", 1e6},   {"mi", 1048576.0},       {"mib", 1048576.0},
      {"g", 1e9}, {"gb", 1e9},   {"gi", 1073741824.0},    {"gib", 1073741824.0},
      {"t", 1e12}, {"tb", 1e12}, {"ti", 1099511627776.0}, {"tib", 1099511627776.0}};
  const char* begin = s.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  std::string unit;
  for (const char* p = end; p && *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p))) unit += char(std::tolower(static_cast<unsigned char>(*p)));
  const auto u = units.find(unit);
  if (end == begin || !std::isfinite(v) || v <= 0 || u == units.end())
    throw Error(flag + " '" + s + "' is not a size (a number and a unit: B, KB, MB, GB, TB = powers of 1000; "
                "KiB, MiB, GiB, TiB = powers of 1024)");
  const double bytes = v * u->second;
  if (bytes >= 1.8e19) throw Error(flag + " '" + s + "' is too large");
  return uint64_t(bytes);
}

}  // namespace nibble

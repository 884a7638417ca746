#include "calib/stats_space.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "loaders/error.h"
#include "loaders/owner.h"

namespace fs = std::filesystem;

namespace nibble {
namespace {

constexpr const char* kPrefix = "nibble-calib-";

std::string format_bytes(uint64_t n) {
  char b[32];
  std::snprintf(b, sizeof b, n >= 1000000000ull ? "%.1f GB" : "%.1f MB", n >= 1000000000ull ? double(n) / 1e9 : double(n) / 1e6);
  return b;
}

uint64_t folder_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

}  // namespace

uint64_t statistics_bytes(const std::vector<Calibration::Request>& acts, const CalibrationExtras& extras) {
  uint64_t n = 0;
  for (const auto& a : acts) {
    const auto K = uint64_t(a.K);
    n += K * (4 + 8);  // mean |x| (float32) and Σ|x| (float64)
    if (extras.gram_block > 0) {
      const auto B = uint64_t(extras.gram_block);
      n += (K + B - 1) / B * B * B * 8;
    } else {
      n += K * K * 8;
    }
    if (extras.sample_tokens > 0) n += uint64_t(extras.sample_tokens) * K * 4;
  }
  return n;
}

void check_free_space(const std::string& dir, uint64_t needed, const std::string& what) {
  std::error_code ec;
  uint64_t free_b = fs::space(dir, ec).available;
  if (ec) return;  // nothing to say: the write itself will fail with its own line
  if (const char* t = std::getenv("NIBBLE_TEST_TMP_FREE_BYTES"); t && *t) free_b = std::strtoull(t, nullptr, 10);
  if (free_b >= needed) return;
  throw Error(what + " needs " + format_bytes(needed) + " in " + dir + ", " + format_bytes(free_b) +
              " free: set TMPDIR to a larger disk, or quantize layer by layer (--layer_by_layer on)");
}

uint64_t sweep_dead_statistics(const std::string& tmp) {
  uint64_t freed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || !e.is_directory(ec)) continue;
    // "<owner tag>-XXXXXX": the tag is everything between the prefix and mkdtemp's last dash.
    const std::string rest = name.substr(std::string(kPrefix).size());
    const size_t dash = rest.rfind('-');
    Owner owner;
    if (dash == std::string::npos || !parse_owner_tag(rest.substr(0, dash), &owner) || owner_alive(owner)) continue;
    const uint64_t n = folder_bytes(e.path());
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) freed += n;
  }
  if (freed > 0) spdlog::info("calibration: removed {} of statistics left in {} by runs that died", format_bytes(freed), tmp);
  return freed;
}

std::string statistics_dir_template(const std::string& tmp) {
  return (fs::path(tmp) / (std::string(kPrefix) + owner_tag(current_owner()) + "-XXXXXX")).string();
}

}  // namespace nibble

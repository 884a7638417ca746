#include "loaders/owner.h"

#include <unistd.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace nibble {

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string line, out;
  std::getline(f, line);
  for (char c : line)
    if (std::isxdigit(static_cast<unsigned char>(c))) out += char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

uint64_t process_start_time(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return 0;
  // The command name (field 2) is in parentheses and may hold spaces and parentheses itself: count
  // from after the last ')'. There the state is field 3, so the start time is the 20th word.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  std::string word;
  for (int field = 3; field <= 22; ++field)
    if (!(rest >> word)) return 0;
  try {
    return std::stoull(word);
  } catch (...) {
    return 0;
  }
}

const Owner& current_owner() {
  static const Owner me = [] {
    Owner o;
    o.pid = long(::getpid());
    o.boot_id = boot_id();
    o.start_time = process_start_time(o.pid);
    return o;
  }();
  return me;
}

std::string owner_tag(const Owner& o) {
  return std::to_string(o.pid) + "-" + o.boot_id + "-" + std::to_string(o.start_time);
}

namespace {
bool all_of(const std::string& s, int (*pred)(int)) {
  if (s.empty()) return false;
  for (char c : s)
    if (!pred(static_cast<unsigned char>(c))) return false;
  return true;
}
}  // namespace

bool parse_owner_tag(const std::string& tag, Owner* o) {
  const auto a = tag.find('-'), b = tag.rfind('-');
  if (a == std::string::npos || a == b) return false;
  const std::string pid = tag.substr(0, a), boot = tag.substr(a + 1, b - a - 1), start = tag.substr(b + 1);
  if (!all_of(pid, ::isdigit) || !all_of(boot, ::isxdigit) || !all_of(start, ::isdigit)) return false;
  if (pid.size() > 9 || start.size() > 19) return false;
  o->pid = std::stol(pid);
  o->boot_id = boot;
  o->start_time = std::stoull(start);
  return o->pid > 0;
}

bool owner_alive(const Owner& o) {
  if (o.boot_id != current_owner().boot_id) return false;  // written before a reboot
  const uint64_t start = process_start_time(o.pid);
  return start != 0 && start == o.start_time;
}

}  // namespace nibble

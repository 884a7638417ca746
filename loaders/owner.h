// Who owns a temporary file: a process named by its pid, the boot it runs in and its start time.
// A pid alone is not enough to tell a dead run from a live one: pids are reused, differ across pid
// namespaces, and restart from 1 after a reboot. The start time (field 22 of /proc/<pid>/stat, in clock
// ticks since boot) tells a reused pid apart, and the boot id a pid of an earlier boot.
#pragma once
#include <cstdint>
#include <string>

namespace nibble {

struct Owner {
  long pid = 0;
  std::string boot_id;     // /proc/sys/kernel/random/boot_id without its dashes (32 hex digits)
  uint64_t start_time = 0;
};

// This process.
const Owner& current_owner();

// "<pid>-<boot id>-<start time>": the text a temporary's name ends with.
std::string owner_tag(const Owner& o);
// Reads a tag; false for anything that is not one (a pid alone, as older versions wrote, included).
bool parse_owner_tag(const std::string& tag, Owner* o);

// Alive: same boot, and /proc/<pid>/stat exists with the same start time. A process of another pid
// namespace is seen under another pid, so it reads as dead here; runs sharing an output folder from
// different namespaces are not supported.
bool owner_alive(const Owner& o);

// Field 22 of /proc/<pid>/stat; 0 when there is no such process (or it cannot be read).
uint64_t process_start_time(long pid);
// This boot's id without dashes; "" when /proc is not there.
std::string boot_id();

}  // namespace nibble

// Sizes as people read them, for the log.
#pragma once
#include <cstdint>
#include <string>

namespace nibble {

// "1.50 GiB", "12.3 MiB", "4.0 KiB", "17 B".
std::string human_bytes(uint64_t n);

// A size a flag takes, in bytes: a positive number and a unit, case ignored, as the SI and IEC names
// say: B; KB, MB, GB, TB (or K, M, G, T) are powers of 1000; KiB, MiB, GiB, TiB powers of 1024; no unit
// is bytes. So "1GB" is 1000000000 and "1GiB" 1073741824. Throws Error naming `flag` on anything else.
uint64_t parse_size(const std::string& s, const std::string& flag);

}  // namespace nibble

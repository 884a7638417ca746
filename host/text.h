// Sizes as people read them, for the log.
#pragma once
#include <cstdint>
#include <string>

namespace nibble {

// "1.50 GiB", "12.3 MiB", "4.0 KiB", "17 B".
std::string human_bytes(uint64_t n);

}  // namespace nibble

// Sizes as people read them, for the log.
#pragma once
#include <cstdint>
#include <string>

namespace nibble {

// "1.50 GiB", "12.3 MiB", "4.0 KiB", "17 B".
std::string human_bytes(uint64_t n);

// "1GiB", "512MiB", "8G", "300MB", "65536": bytes (K/M/G/T and their iB forms are powers of 1024,
// as device memory is counted). Throws Error naming `flag` on anything else.
uint64_t parse_size(const std::string& s, const std::string& flag);

}  // namespace nibble

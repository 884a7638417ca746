// XXH64 of a byte stream fed in pieces: names the output data file after its content, so the same
// input and flags give the same name (and graph) on every run, and new data never takes the name of
// different old data still in use. Fast (several GB/s) because every output byte goes through it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nibble {

class ContentHash {
 public:
  void update(const void* data, size_t n);
  uint64_t digest() const;          // of everything so far; update() may go on after it
  std::string hex() const;          // digest() as 16 lowercase hex digits
  uint64_t bytes() const { return total_; }

 private:
  uint64_t v_[4] = {0x60ea27eeadc0b5d6ULL, 0xc2b2ae3d27d4eb4fULL, 0, 0x61c8864e7a143579ULL};
  uint8_t buf_[32] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

}  // namespace nibble

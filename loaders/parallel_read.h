// Reading a range of a file at memory speed: several threads pread large aligned pieces of it into
// one buffer (a device's staging copies each weight anyway; the CPU reads the map: weight_stream.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nibble {

// Bytes read and where the time went, for the report (summary.read_gbps, summary.read).
struct ReadStats {
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0;       // wall time of the reads, each read one range at a time
  double wait_seconds = 0;  // how long the quantizer waited for a read that was not done yet
  int threads = 0;
  // The kernels read the memory map itself (WeightStream::Reading::kMapAhead): `seconds` is then the
  // time spent mapping pages ahead, not reading them, and the report's read rate is the quantize stage's.
  bool mapped = false;
  void add(const ReadStats& o);
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

// Pieces of a read: 4 MiB at offsets that are multiples of 4 MiB (the first and last may be shorter),
// so each pread hands whole pages of the page cache to one thread and the system calls stay few.
constexpr size_t kReadPiece = size_t(4) << 20;

// Reads `length` bytes at `offset` of the open file `fd` into `dst` with up to `threads` threads (the
// caller's included). Throws Error naming `what` (the tensor) and `path` on a failed or short read.
void parallel_pread(int fd, uint64_t offset, uint64_t length, uint8_t* dst, int threads, const std::string& what,
                    const std::string& path, size_t piece = kReadPiece);

}  // namespace nibble

#include "loaders/parallel_read.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

#include "loaders/error.h"

namespace nibble {

void ReadStats::add(const ReadStats& o) {
  bytes += o.bytes;
  tensors += o.tensors;
  seconds += o.seconds;
  wait_seconds += o.wait_seconds;
  threads = std::max(threads, o.threads);
  mapped = mapped || o.mapped;
}

namespace {

// One piece, whole: pread may return less than asked (a signal, a large request); 0 means the file
// ended before the range did (it shrank after the range was checked against its size).
void pread_all(int fd, uint64_t offset, uint64_t length, uint8_t* dst, const std::string& what,
               const std::string& path) {
  while (length > 0) {
    const ssize_t n = ::pread(fd, dst, size_t(length), off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error("tensor '" + what + "': cannot read " + path + " at offset " + std::to_string(offset) + ": " +
                  errno_text(errno));
    if (n == 0)
      throw Error("tensor '" + what + "': " + path + " ends before offset " + std::to_string(offset) +
                  " (the file was truncated while nibble read it)");
    dst += n;
    offset += uint64_t(n);
    length -= uint64_t(n);
  }
}

}  // namespace

void parallel_pread(int fd, uint64_t offset, uint64_t length, uint8_t* dst, int threads, const std::string& what,
                    const std::string& path, size_t piece) {
  if (length == 0) return;
  piece = std::max<size_t>(piece, 1);
  // Piece k covers [start_k, start_k+1): start_0 = offset, then the multiples of `piece` after it.
  const uint64_t first_end = std::min(offset + length, (offset / piece + 1) * piece);
  const uint64_t pieces = 1 + (offset + length - first_end + piece - 1) / piece;
  const auto begin_of = [&](uint64_t k) { return k == 0 ? offset : (offset / piece + k) * piece; };
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (uint64_t k; !failed && (k = next.fetch_add(1)) < pieces;) {
      const uint64_t b = begin_of(k), e = std::min(offset + length, begin_of(k + 1));
      try {
        pread_all(fd, b, e - b, dst + (b - offset), what, path);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const int workers = int(std::min<uint64_t>(uint64_t(std::max(threads, 1)), pieces));
  std::vector<std::thread> pool;
  for (int t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace nibble

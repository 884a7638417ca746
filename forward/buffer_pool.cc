#include "forward/buffer_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace nibble::forward {

namespace {

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> idle;  // by mapped size
  size_t idle_bytes = 0;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: values may outlive static destruction order
  return *p;
}

size_t mapped_size(size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Fresh pages for a buffer of `size` bytes (a multiple of the page). Transparent huge pages (madvise) were
// tried for a 7B layer's 90-180 MB buffers: with the page cache full of the model, the kernel compacted
// memory on their faults and the operators that first wrote them ran 1.5-2.5x slower.
void* map_pages(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

}  // namespace

void* pool_alloc(size_t bytes) {
  if (bytes < kPooledBytes) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t size = mapped_size(bytes);
  {
    Pool& P = pool();
    std::lock_guard<std::mutex> lock(P.mu);
    if (auto it = P.idle.find(size); it != P.idle.end()) {
      void* p = it->second;
      P.idle.erase(it);
      P.idle_bytes -= size;
      return p;
    }
  }
  return map_pages(size);
}

void pool_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kPooledBytes) {
    std::free(p);
    return;
  }
  const size_t size = mapped_size(bytes);
  if (size > kIdleBytes) {
    ::munmap(p, size);
    return;
  }
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  while (P.idle_bytes + size > kIdleBytes) {  // the newest buffer stays: its shape is the one in use
    auto old = P.idle.begin();
    ::munmap(old->second, old->first);
    P.idle_bytes -= old->first;
    P.idle.erase(old);
  }
  P.idle.emplace(size, p);
  P.idle_bytes += size;
}

void pool_release_idle() noexcept {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  for (const auto& [size, p] : P.idle) ::munmap(p, size);
  P.idle.clear();
  P.idle_bytes = 0;
}

size_t pool_idle_bytes() {
  Pool& P = pool();
  std::lock_guard<std::mutex> lock(P.mu);
  return P.idle_bytes;
}

}  // namespace nibble::forward

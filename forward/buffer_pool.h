// Memory for the layer engine's values. The same shapes come back layer after layer, so large buffers
// are recycled by size instead of freed: the engine allocates a few MiB per operator, and the process
// keeps freed heap memory for the quantizer's reuse (cli/heap_startup), where a second thread's arena
// would otherwise grow with every layer's fragments. Large buffers are mapped pages of their own; at most
// kIdleBytes of them wait for reuse, the rest go back to the system.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace nibble::forward {

constexpr size_t kPooledBytes = size_t(256) << 10;  // smaller buffers come from malloc
constexpr size_t kIdleBytes = size_t(32) << 20;

// Never null (throws std::bad_alloc); `bytes` must be given back to pool_free unchanged.
void* pool_alloc(size_t bytes);
void pool_free(void* p, size_t bytes) noexcept;
// Bytes held for reuse now (for tests).
size_t pool_idle_bytes();

template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(pool_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { pool_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const PoolAllocator<U>&) const { return false; }
};

// The float32 elements an operator computes (a Value adopts them without a copy: from_floats).
using Floats = std::vector<float, PoolAllocator<float>>;

}  // namespace nibble::forward

// Memory for the layer engine's values. The same shapes come back layer after layer, so large buffers
// are recycled by size instead of freed: the engine allocates a few MiB per operator, and the process
// keeps freed heap memory for the quantizer's reuse (cli/heap_startup), where a second thread's arena
// would otherwise grow with every layer's fragments. Large buffers are mapped pages of their own; at most
// kIdleBytes of them wait for reuse, the rest go back to the system, and every idle one goes back when a
// pass ends (pool_release_idle). 1 GiB: a 7B layer's activations are 34-100 MB each for 2048 tokens, and
// with 64 MiB every one of them was mapped afresh and faulted in, operator after operator (the forward of
// two 7B-shaped layers: 399 k page faults against 254 k, 0.89 s outside its products against 0.69 s, for
// 0.53 GB more peak RSS during the pass); with 32 MiB a SmolLM2 pass of 1024 tokens mapped 500 fresh
// buffers instead of 91 and took 15% longer.
#pragma once
#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace nibble::forward {

constexpr size_t kPooledBytes = size_t(256) << 10;  // smaller buffers come from malloc
constexpr size_t kIdleBytes = size_t(1024) << 20;

// Never null (throws std::bad_alloc); `bytes` must be given back to pool_free unchanged.
void* pool_alloc(size_t bytes);
void pool_free(void* p, size_t bytes) noexcept;
// Bytes held for reuse now (for tests).
size_t pool_idle_bytes();
// Gives every idle buffer back to the system: at the end of a pass, so that what the next one needs is
// not held while other work (the search) runs.
void pool_release_idle() noexcept;

template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(pool_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { pool_free(p, n * sizeof(T)); }
  // Elements are default-initialized (for float: not zeroed): every operator writes each element of its
  // result, and zeroing first cost a pass over memory per operator. Floats(n, 0.0f) still zeroes.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const PoolAllocator<U>&) const { return false; }
};

// The float32 elements an operator computes (a Value adopts them without a copy: from_floats).
using Floats = std::vector<float, PoolAllocator<float>>;

}  // namespace nibble::forward

// The thin device layer under the CUDA backend: memory, copies and synchronisation. Two
// implementations: the CUDA runtime (cuda_runtime_device.cu, GPU builds only) and the emulated
// device (emulated_device.cc: host memory standing in for device memory). Both account every
// allocation against a budget (--device_memory), so the emulated device shows in CI that a run
// stays within what a real card would give it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace nibble::kernels::gpu {

class DeviceLayer {
 public:
  explicit DeviceLayer(uint64_t budget) : budget_(budget) {}
  virtual ~DeviceLayer() = default;
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;

  virtual std::string name() const = 0;  // "cuda" or "cuda_emulated"
  virtual std::string describe() const = 0;

  // Device memory within the budget: throws std::runtime_error naming the request, the budget and
  // what is held when it does not fit. Sizes are counted rounded up to 256 bytes (cudaMalloc's
  // granularity), so the emulated peak is what a GPU would hold. Pooled: a released block is kept
  // for the next request of the same counted size (no cudaMalloc/cudaFree per operation); the pool
  // is emptied when a request would not fit beside it. Held memory (in use + pooled) is what the
  // budget bounds and what the peak reports.
  void* allocate(size_t bytes);
  void release(void* p, size_t bytes);

  // Copies (host <-> device, device <-> device); 2-D forms copy `height` rows of `width` bytes
  // between pitched arrays, as cudaMemcpy2D. Synchronous: the backend uses one stream. Each is
  // entered in the transfer ledger under the current operation.
  void to_device(void* dst, const void* src, size_t bytes);
  void to_host(void* dst, const void* src, size_t bytes);
  void to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
  void to_host_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
  // Device to device (cudaMemcpy2D's DeviceToDevice): never crosses the bus, not in the ledger.
  virtual void on_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                            size_t height) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Waits for the launches issued so far (a kernel error surfaces here).
  virtual void synchronize() = 0;

  // The ledger: launches (kernels and BLAS/solver calls) and host fallbacks are reported by the
  // backend; copies and allocations are counted here.
  void count_launch(uint64_t n = 1);
  void count_flops(double fp32, double fp64 = 0);
  void count_host_fallback();
  const TransferLedger& ledger() const { return ledger_; }
  // The operation that the counts go to; nested operations count towards the outermost one.
  void begin_op(const char* name);
  void end_op();

  uint64_t budget() const { return budget_; }
  uint64_t in_use() const { return in_use_; }
  // Held by live allocations (in_use less the pool, which gives its blocks back when a request needs them).
  uint64_t in_use_live() const { return in_use_ - pooled_; }
  uint64_t peak() const { return peak_; }

  static size_t counted(size_t bytes) { return (bytes + 255) / 256 * 256; }

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;  // nullptr when the device has no more memory
  virtual void raw_release(void* p) = 0;
  virtual void raw_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void raw_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void raw_to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                size_t height) = 0;
  virtual void raw_to_host_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                              size_t height) = 0;
  // Returns the pooled blocks to the device; an implementation's destructor calls it (the base's
  // destructor can no longer reach raw_release).
  void drain_pool();

 private:
  void count(uint64_t OpTransfers::*field, uint64_t n);

  uint64_t budget_;
  uint64_t in_use_ = 0;  // held: live allocations + pooled blocks
  uint64_t pooled_ = 0;
  uint64_t peak_ = 0;
  std::multimap<size_t, void*> pool_;  // counted size -> free block
  TransferLedger ledger_;
  OpTransfers* op_ = nullptr;
  int op_depth_ = 0;
};

// Enters one Backend operation in the ledger for its lifetime.
class OpScope {
 public:
  OpScope(DeviceLayer& dev, const char* name) : dev_(dev) { dev_.begin_op(name); }
  ~OpScope() { dev_.end_op(); }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  DeviceLayer& dev_;
};

// Device memory for `n` elements of T, released when it goes out of scope.
template <class T>
class DeviceBuffer {
  template <class U>
  friend class DeviceBuffer;

 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceLayer& dev, size_t n) : dev_(&dev), n_(n) {
    p_ = static_cast<T*>(n ? dev.allocate(n * sizeof(T)) : nullptr);
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_, p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  void reset() {
    if (p_) dev_->release(p_, n_ * sizeof(T));
    p_ = nullptr;
    n_ = 0;
  }
  // Takes over another buffer's allocation as an array of T (its bytes must be a multiple of sizeof(T)).
  template <class U>
  static DeviceBuffer adopt(DeviceBuffer<U>&& o) {
    DeviceBuffer b;
    b.dev_ = o.dev_, b.p_ = reinterpret_cast<T*>(o.p_), b.n_ = o.n_ * sizeof(U) / sizeof(T);
    o.p_ = nullptr, o.n_ = 0;
    return b;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  DeviceLayer* dev_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

// The emulated device: host memory, copies as memcpy, nothing to wait for.
std::unique_ptr<DeviceLayer> make_emulated_device(uint64_t budget);

// Default budget of the emulated device when --device_memory is not given.
constexpr uint64_t kEmulatedDefaultBudget = uint64_t(1) << 30;

}  // namespace nibble::kernels::gpu

// The thin device layer under the CUDA backend: memory, copies, streams and synchronisation. Two
// implementations: the CUDA runtime (cuda_runtime_device.cu, GPU builds only) and the emulated device
// (emulated_device.cc: host memory standing in for device memory). Both account every allocation
// against a budget (--device_memory), so the emulated device shows in CI that a run stays within what a
// real card would give it.
//
// Copies overlap compute. Every host <-> device copy goes through a small ring of pinned staging
// buffers (kStagingSlots of staging_chunk() bytes per lane, allocated once), in chunks: filling slot
// i + 2 from the host's pages overlaps the DMAs of slots i and i + 1, so the bus has a chunk queued while
// another moves (the ledger's uploads_in_flight says how deep the ring ran). Three streams:
// the compute stream (kernels, BLAS, device copies), the copy stream (the operations' own uploads and
// downloads, ordered against the compute stream by events) and the prefetch stream (Backend::upload's
// uploads, issued by a host thread of their own, so that the next weight goes up while this one
// computes and comes back). The emulated device has the same structure, its streams running each copy
// at once: the ledger counts the same bytes, chunks and prefetches either way.
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace nibble::kernels::gpu {

class DeviceLayer;
class DeviceArena;

// An upload enqueued ahead of the operation that reads it (DeviceLayer::prefetch). await() makes the
// compute stream wait for it (the host only until its copies are issued); the handle awaits on
// destruction, so the memory it fills is not handed out again while the copy runs.
class Prefetch {
 public:
  Prefetch() = default;
  Prefetch(DeviceLayer* dev, uint64_t ticket) : dev_(dev), ticket_(ticket) {}
  ~Prefetch();
  Prefetch(Prefetch&& o) noexcept : dev_(o.dev_), ticket_(o.ticket_) { o.ticket_ = 0; }
  Prefetch& operator=(Prefetch&& o) noexcept;
  Prefetch(const Prefetch&) = delete;
  Prefetch& operator=(const Prefetch&) = delete;
  void await();  // throws when the upload failed, naming the operation that waited
  bool pending() const { return ticket_ != 0; }

 private:
  DeviceLayer* dev_ = nullptr;
  uint64_t ticket_ = 0;
};

class DeviceLayer {
 public:
  // Bytes of one staging buffer (a chunk of a copy); three per lane.
  static constexpr size_t kDefaultStagingChunk = size_t(16) << 20;
  static constexpr int kStagingSlots = 3;

  explicit DeviceLayer(uint64_t budget, size_t staging_chunk = kDefaultStagingChunk);
  virtual ~DeviceLayer();
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;

  virtual std::string name() const = 0;  // "cuda" or "cuda_emulated"
  virtual std::string describe() const = 0;

  // Device memory within the budget: throws std::runtime_error naming the request, the budget and
  // what is held when it does not fit. Sizes are counted rounded up to 256 bytes (cudaMalloc's
  // granularity), so the emulated peak is what a GPU would hold. Pooled: a released block is kept
  // for the next request of the same counted size (no cudaMalloc/cudaFree per operation); the pool
  // is emptied when a request would not fit beside it. Held memory (in use + pooled) is what the
  // budget bounds and what the peak reports. A block released while the compute stream may still read
  // it carries an event recorded there; it is handed out again only once the stream has passed it.
  void* allocate(size_t bytes);
  void release(void* p, size_t bytes);

  // Copies (host <-> device); 2-D forms copy `height` rows of `width` bytes between pitched arrays, as
  // cudaMemcpy2D. Through the staging ring on the copy stream. to_device*: the source may be reused when
  // it returns, and the compute stream's later work sees the data; it waits for the compute stream's
  // earlier work before writing (no hazard on a buffer a kernel still reads). to_host*: the data is in
  // `dst` when it returns, as the compute stream's earlier work left it (a sync point). Each is entered in
  // the transfer ledger under the current operation.
  void to_device(void* dst, const void* src, size_t bytes);
  void to_host(void* dst, const void* src, size_t bytes);
  void to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
  void to_host_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
  // An upload ahead of its use, on the prefetch stream: returns at once. `src` must stay valid until the
  // handle is awaited or destroyed. Counted as a prefetch of the current operation; one is counted as
  // overlapped when launches were issued between its enqueue and its first await.
  Prefetch prefetch(void* dst, const void* src, size_t bytes);
  // Device to device (cudaMemcpy2DAsync on the compute stream): never crosses the bus, not in the ledger.
  virtual void on_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                            size_t height) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Waits for the compute stream's work so far: a failed kernel surfaces here, naming the operation.
  virtual void synchronize() = 0;
  // The compute stream (a cudaStream_t on a GPU; null on the emulated device): launches and BLAS use it.
  virtual void* compute_stream() const { return nullptr; }

  // The ledger: launches (kernels and BLAS/solver calls) and host fallbacks are reported by the
  // backend; copies and allocations are counted here.
  void count_launch(uint64_t n = 1);
  void count_flops(double fp32, double fp64 = 0);
  void count_host_fallback();
  const TransferLedger& ledger() const { return ledger_; }
  // The operation that the counts go to; nested operations count towards the outermost one.
  void begin_op(const char* name);
  void end_op();
  // Its name, for errors ("(outside an operation)" between operations).
  std::string current_op() const;
  // Throws std::runtime_error "NAME: OP: what" (e.g. "cuda: rtn_lsq: an illegal memory access ...").
  [[noreturn]] void fail(const std::string& what) const;

  uint64_t budget() const { return budget_; }
  uint64_t in_use() const { return in_use_; }
  // Held by live allocations (in_use less the pool, which gives its blocks back when a request needs them).
  uint64_t in_use_live() const { return in_use_ - pooled_; }
  uint64_t peak() const { return peak_; }
  size_t staging_chunk() const { return chunk_; }

  static size_t counted(size_t bytes) { return (bytes + 255) / 256 * 256; }
  // The chunks a 2-D copy of `height` rows of `width` bytes takes through staging buffers of `chunk` bytes.
  static uint64_t chunks_of(size_t width, size_t height, size_t chunk);

  // Called by Prefetch.
  void await_prefetch(uint64_t ticket);

 protected:
  // A ring of staging buffers: the copy stream's (uploads and downloads of the operations, on the thread
  // that calls them) and the prefetch stream's (on the thread that issues prefetches).
  enum Lane { kCopyLane = 0, kPrefetchLane = 1, kLanes = 2 };

  virtual void* raw_allocate(size_t bytes) = 0;  // nullptr when the device has no more memory
  virtual void raw_release(void* p) = 0;
  virtual uint8_t* staging_allocate(size_t bytes) = 0;  // pinned host memory on a GPU
  virtual void staging_release(uint8_t* p) = 0;
  // The host waits for the last copy through a slot (a sync point: an earlier failure surfaces here).
  virtual void slot_wait(Lane lane, int slot) = 0;
  // Enqueues `rows` rows of `width` bytes from the slot (packed) to dst (pitch dpitch) on the lane's
  // stream, and records the slot's event.
  virtual void slot_to_device(Lane lane, int slot, void* dst, size_t dpitch, size_t width, size_t rows) = 0;
  // Enqueues rows from src (pitch spitch) into the copy lane's slot (packed), and records its event.
  virtual void slot_from_device(int slot, const void* src, size_t spitch, size_t width, size_t rows) = 0;
  // The copy stream waits for the compute stream's work so far, or the compute stream for the copy
  // stream's (events; the host does not wait).
  virtual void copy_after_compute() = 0;
  virtual void compute_after_copy() = 0;
  // Starts a prefetch (stage_in on the prefetch lane, now or on a thread of its own); then makes the
  // compute stream wait for it (the host waits until its copies are issued; throws its error).
  virtual void start_prefetch(uint64_t ticket, void* dst, const void* src, size_t bytes) = 0;
  virtual void compute_after_prefetch(uint64_t ticket) = 0;
  // A released block's event on the compute stream; the host waits for it before the block is reused.
  virtual uint64_t fence_compute() { return 0; }
  virtual void wait_fence(uint64_t) {}
  virtual void drop_fence(uint64_t) {}
  // A launch was counted (the emulated device's test hook).
  virtual void on_launch() {}

  // Copies host rows through the lane's staging ring to the device (chunked; the last DMAs may still
  // run when it returns). Touches no ledger: a prefetch's thread calls it (the depth of the ring it used
  // goes to the lane's peak, which the ledger takes on the host's thread: take_in_flight_peak).
  void stage_in(Lane lane, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
  // Copies device rows back through the copy lane's ring: two chunks in flight while the host empties one.
  void stage_out(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
  uint8_t* slot_buffer(Lane lane, int slot) const { return ring_[lane][slot]; }
  // Returns the pooled blocks and the staging buffers; an implementation's destructor calls it (the
  // base's destructor can no longer reach the virtual functions).
  void drain_pool();
  void release_staging();

 private:
  friend class DeviceArena;  // its pieces are fenced as the pool's blocks are
  struct Pooled {
    void* p;
    uint64_t fence;
  };
  struct PrefetchRecord {
    uint64_t bytes, launches_at_start;
    OpTransfers* op;
  };
  void count(uint64_t OpTransfers::*field, uint64_t n);
  // The lane's deepest ring since the last call, into the ledger's uploads_in_flight (a maximum) of `op`.
  void take_in_flight_peak(Lane lane, OpTransfers* op);
  void count_staged(uint64_t bytes, uint64_t chunks);
  uint8_t* slot_for(Lane lane, int slot);

  uint64_t budget_;
  size_t chunk_;
  uint64_t in_use_ = 0;  // held: live allocations + pooled blocks
  uint64_t pooled_ = 0;
  uint64_t peak_ = 0;
  std::multimap<size_t, Pooled> pool_;  // counted size -> free block
  uint8_t* ring_[kLanes][kStagingSlots] = {};
  int next_slot_[kLanes] = {};
  // A DMA from the slot was enqueued and the host has not waited for it since; each lane's own thread
  // only. The peak: the most such uploads while the host filled a slot.
  bool in_flight_[kLanes][kStagingSlots] = {};
  std::atomic<uint64_t> in_flight_peak_[kLanes] = {};
  uint64_t next_ticket_ = 1;
  std::map<uint64_t, PrefetchRecord> prefetches_;  // enqueued, not yet awaited
  TransferLedger ledger_;
  OpTransfers* op_ = nullptr;
  std::string op_name_;
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

// One allocation handed out in pieces: arrays held together for a while (the weights a whole-model search
// keeps for the quantizer) take one device allocation between them instead of one each, and a run twice as
// long makes no more. First fit over the free ranges (coalesced), pieces aligned to 256 bytes. A piece given
// back carries an event of the compute stream, as a pooled block does, and is handed out again only once the
// stream has passed it.
class DeviceArena {
 public:
  DeviceArena(DeviceLayer& dev, size_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // A piece of `bytes` (nullptr when no free range holds it: nothing is allocated instead).
  void* take(size_t bytes);
  void give(void* p, size_t bytes);
  size_t capacity() const { return block_.bytes(); }
  size_t free_bytes() const;

 private:
  struct Range {
    size_t bytes;
    std::vector<uint64_t> fences;  // of the pieces given back into it, not yet passed
  };
  DeviceLayer& dev_;
  DeviceBuffer<uint8_t> block_;
  std::map<size_t, Range> free_;  // offset -> free range
};

// The emulated device: host memory, the staging ring as host buffers, copies as memcpy, streams that run
// each copy and launch at once. `staging_chunk`: the bytes of one staging buffer (tests make it small).
std::unique_ptr<DeviceLayer> make_emulated_device(uint64_t budget,
                                                  size_t staging_chunk = DeviceLayer::kDefaultStagingChunk);

// Test hook of the emulated device: the `nth` launch (kernel or BLAS call) or staged copy from now on fails
// as a GPU's would, asynchronously: the error surfaces at the next sync point, naming the operation then
// running. `dev` must be an emulated device.
enum class EmulatedFault { kLaunch, kCopy };
void inject_fault(DeviceLayer& dev, EmulatedFault what, uint64_t nth = 1);

// Default budget of the emulated device when --device_memory is not given.
constexpr uint64_t kEmulatedDefaultBudget = uint64_t(1) << 30;

}  // namespace nibble::kernels::gpu

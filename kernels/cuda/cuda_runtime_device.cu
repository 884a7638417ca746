// The real device layer: the CUDA runtime. GPU builds only; the emulated device is its twin.
//
// Written without a GPU and exercised through its emulated twin (the same chunking and ordering logic in
// kernels/cuda/device.cc, copies done at once); since run on an H200 (bench/log/gpu-runs).
//
// Ordering, all by events (the host waits only where a result must come back):
//  - compute stream: kernels, cuBLAS/cuSOLVER, device-to-device copies, memsets;
//  - copy stream: the operations' own uploads (after the compute stream's earlier work: an upload never
//    overwrites a buffer a kernel still reads) and downloads (after the compute stream's work); the
//    compute stream waits for the uploads;
//  - prefetch stream: Backend::keep's uploads, issued by a thread of their own (it fills the staging
//    buffers from the mapped pages while the host's thread runs the current weight); the compute stream
//    waits for one when an operation first reads the weight.
// A staging slot is refilled only after the event of its last copy completed; a pooled device block is
// handed out again only after the compute stream passed the event recorded at its release.
#include <cuda_runtime.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/device.h"

namespace nibble::kernels::gpu {
namespace {

// Set on the prefetch thread: its errors carry no operation name (the host's thread adds it when it waits).
thread_local bool on_prefetch_thread = false;

class RuntimeDevice final : public DeviceLayer {
 public:
  explicit RuntimeDevice(uint64_t budget);
  ~RuntimeDevice() override;
  std::string name() const override { return "cuda"; }
  std::string describe() const override { return "cuda: " + cuda::device_name(); }
  void on_device_2d(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h) override {
    check(copy(d, dp, s, sp, w, h, cudaMemcpyDeviceToDevice, compute_), "2-D copy on the device");
  }
  void fill_zero(void* d, size_t n) override { check(cudaMemsetAsync(d, 0, n, compute_), "memset"); }
  void synchronize() override { check(cudaStreamSynchronize(compute_), nullptr); }
  void* compute_stream() const override { return compute_; }

 protected:
  void* raw_allocate(size_t n) override {
    void* p = nullptr;
    return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
  }
  void raw_release(void* p) override { cudaFree(p); }
  uint8_t* staging_allocate(size_t n) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, n, cudaHostAllocDefault), "pinned staging buffer");
    return static_cast<uint8_t*>(p);
  }
  void staging_release(uint8_t* p) override { cudaFreeHost(p); }
  void slot_wait(Lane lane, int slot) override { check(cudaEventSynchronize(slot_event_[lane][slot]), nullptr); }
  void slot_to_device(Lane lane, int slot, void* dst, size_t dpitch, size_t width, size_t rows) override {
    cudaStream_t s = lane == kCopyLane ? copy_ : prefetch_;
    check(copy(dst, dpitch, slot_buffer(lane, slot), width, width, rows, cudaMemcpyHostToDevice, s), "copy to device");
    check(cudaEventRecord(slot_event_[lane][slot], s), "event");
  }
  void slot_from_device(int slot, const void* src, size_t spitch, size_t width, size_t rows) override {
    check(copy(slot_buffer(kCopyLane, slot), width, src, spitch, width, rows, cudaMemcpyDeviceToHost, copy_),
          "copy to host");
    check(cudaEventRecord(slot_event_[kCopyLane][slot], copy_), "event");
  }
  // One event each way, re-recorded every time: cudaStreamWaitEvent waits for the record made before it.
  void copy_after_compute() override {
    check(cudaEventRecord(compute_mark_, compute_), "event");
    check(cudaStreamWaitEvent(copy_, compute_mark_, 0), "stream wait");
  }
  void compute_after_copy() override {
    check(cudaEventRecord(copy_mark_, copy_), "event");
    check(cudaStreamWaitEvent(compute_, copy_mark_, 0), "stream wait");
  }
  void start_prefetch(uint64_t ticket, void* dst, const void* src, size_t bytes) override;
  void compute_after_prefetch(uint64_t ticket) override;
  uint64_t fence_compute() override;
  void wait_fence(uint64_t id) override;
  void drop_fence(uint64_t id) override;

 private:
  struct Job {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded on the prefetch stream after its last chunk
    bool issued = false;
    std::string error;
  };
  // Contiguous copies as 1-D ones: a 1-D copy's "pitch" (its length) may exceed cudaMemcpy2D's pitch limit.
  static cudaError_t copy(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h, cudaMemcpyKind kind,
                          cudaStream_t stream) {
    if (h == 1 || (dp == w && sp == w)) return cudaMemcpyAsync(d, s, w * h, kind, stream);
    return cudaMemcpy2DAsync(d, dp, s, sp, w, h, kind, stream);
  }
  // Sync points (what == nullptr) name only the operation: "cuda: rtn_lsq: an illegal memory access ...".
  void check(cudaError_t e, const char* what) const {
    if (e == cudaSuccess) return;
    const std::string msg = (what ? std::string(what) + ": " : std::string()) + cudaGetErrorString(e);
    if (on_prefetch_thread) throw std::runtime_error(msg);
    fail(msg);
  }
  cudaEvent_t take_event();
  void give_event(cudaEvent_t e) { free_events_.push_back(e); }
  void run_prefetches();

  cudaStream_t compute_ = nullptr, copy_ = nullptr, prefetch_ = nullptr;
  cudaEvent_t slot_event_[kLanes][kStagingSlots] = {};
  cudaEvent_t compute_mark_ = nullptr, copy_mark_ = nullptr;
  std::vector<cudaEvent_t> all_events_, free_events_;  // the host's thread only
  uint64_t next_fence_ = 1;
  std::map<uint64_t, cudaEvent_t> fences_;
  // The prefetch thread's queue.
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<uint64_t, std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::thread worker_;
};

RuntimeDevice::RuntimeDevice(uint64_t budget) : DeviceLayer(budget) {
  // Non-blocking: no implicit order with the legacy default stream, which nothing here uses.
  for (cudaStream_t* s : {&compute_, &copy_, &prefetch_})
    check(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "stream");
  for (auto& lane : slot_event_)
    for (cudaEvent_t& e : lane) e = take_event();
  compute_mark_ = take_event();
  copy_mark_ = take_event();
  worker_ = std::thread([this] { run_prefetches(); });
}

RuntimeDevice::~RuntimeDevice() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
  cudaDeviceSynchronize();
  drain_pool();
  release_staging();
  for (cudaEvent_t e : all_events_) cudaEventDestroy(e);
  for (cudaStream_t s : {compute_, copy_, prefetch_})
    if (s) cudaStreamDestroy(s);
}

cudaEvent_t RuntimeDevice::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
  all_events_.push_back(e);
  return e;
}

// Called by release(), hence from destructors (DeviceBuffer) and during unwinding: never throws. Without
// an event (none could be made or recorded: the context has failed, and that error surfaces at a sync
// point) the compute stream is waited for here instead, so the block is free when it goes to the pool.
uint64_t RuntimeDevice::fence_compute() {
  cudaEvent_t e = nullptr;
  if (!free_events_.empty()) {
    e = free_events_.back();
    free_events_.pop_back();
  } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
    all_events_.push_back(e);
  } else {
    e = nullptr;
  }
  if (!e || cudaEventRecord(e, compute_) != cudaSuccess) {
    if (e) give_event(e);
    cudaStreamSynchronize(compute_);
    return 0;
  }
  fences_[next_fence_] = e;
  return next_fence_++;
}

void RuntimeDevice::wait_fence(uint64_t id) {
  const auto it = fences_.find(id);
  if (it == fences_.end()) return;
  cudaEvent_t e = it->second;
  fences_.erase(it);
  give_event(e);
  check(cudaEventSynchronize(e), nullptr);
}

void RuntimeDevice::drop_fence(uint64_t id) {
  const auto it = fences_.find(id);
  if (it == fences_.end()) return;
  give_event(it->second);
  fences_.erase(it);
}

void RuntimeDevice::start_prefetch(uint64_t ticket, void* dst, const void* src, size_t bytes) {
  auto job = std::make_shared<Job>();
  job->dst = dst, job->src = src, job->bytes = bytes, job->done = take_event();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(job);
    jobs_[ticket] = job;
  }
  cv_.notify_all();
}

void RuntimeDevice::compute_after_prefetch(uint64_t ticket) {
  std::shared_ptr<Job> job;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto it = jobs_.find(ticket);
    if (it == jobs_.end()) return;
    job = it->second;
    cv_.wait(lock, [&] { return job->issued; });  // its copies are on the prefetch stream
    jobs_.erase(it);
  }
  give_event(job->done);  // cudaStreamWaitEvent below uses the record already made; a reuse re-records later
  if (!job->error.empty()) fail(job->error + " (the upload of a weight kept ahead)");
  check(cudaStreamWaitEvent(compute_, job->done, 0), "stream wait");
}

// The prefetch thread: fills the prefetch lane's staging slots from the host pages and enqueues their DMA,
// one job after another (the lane's ring and stream are its alone).
void RuntimeDevice::run_prefetches() {
  on_prefetch_thread = true;
  cudaSetDevice(0);
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = queue_.front();
      queue_.pop_front();
    }
    try {
      stage_in(kPrefetchLane, job->dst, job->bytes, job->src, job->bytes, job->bytes, 1);
      check(cudaEventRecord(job->done, prefetch_), "event");
    } catch (const std::exception& e) {
      job->error = e.what();
    } catch (...) {
      job->error = "unknown error";
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job->issued = true;
    }
    cv_.notify_all();
  }
}

}  // namespace

std::unique_ptr<DeviceLayer> make_runtime_device(uint64_t budget) { return std::make_unique<RuntimeDevice>(budget); }

}  // namespace nibble::kernels::gpu

namespace nibble::kernels::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

std::string device_name() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "unknown";
  return prop.name;
}

uint64_t free_memory() {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
  return free_b;
}

}  // namespace nibble::kernels::cuda

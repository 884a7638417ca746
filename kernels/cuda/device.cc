#include "kernels/cuda/device.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <vector>

namespace nibble::kernels::gpu {
namespace {

// Sizes in the units a budget is given in: MiB, or KiB below one MiB.
std::string mib(uint64_t b) {
  if (b < (uint64_t(1) << 20)) return std::to_string((b + 1023) >> 10) + " KiB";
  return std::to_string((b + (1u << 19)) >> 20) + " MiB";
}

// One chunk of a 2-D copy: rows [r0, r0 + rows) of bytes [c0, c0 + width) of each. Whole rows while a
// row fits a chunk, else pieces of one row.
struct Piece {
  size_t r0, rows, c0, width;
};

template <class F>
void for_each_piece(size_t width, size_t height, size_t chunk, const F& f) {
  if (width == 0 || height == 0) return;
  if (width <= chunk) {
    const size_t per = chunk / width;
    for (size_t r0 = 0; r0 < height; r0 += per) f(Piece{r0, std::min(per, height - r0), 0, width});
    return;
  }
  for (size_t r = 0; r < height; ++r)
    for (size_t c0 = 0; c0 < width; c0 += chunk) f(Piece{r, 1, c0, std::min(chunk, width - c0)});
}

void copy_rows(uint8_t* dst, size_t dpitch, const uint8_t* src, size_t spitch, size_t width, size_t rows) {
  if (dpitch == width && spitch == width) {
    std::memcpy(dst, src, width * rows);
    return;
  }
  for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dpitch, src + r * spitch, width);
}

}  // namespace

Prefetch::~Prefetch() {
  // A destructor must not throw: a failed upload has surfaced at (or will surface at) a sync point.
  try {
    await();
  } catch (...) {
  }
}

Prefetch& Prefetch::operator=(Prefetch&& o) noexcept {
  if (this != &o) {
    try {
      await();
    } catch (...) {
    }
    dev_ = o.dev_, ticket_ = o.ticket_;
    o.ticket_ = 0;
  }
  return *this;
}

void Prefetch::await() {
  if (!ticket_) return;
  const uint64_t t = ticket_;
  ticket_ = 0;
  dev_->await_prefetch(t);
}

DeviceLayer::DeviceLayer(uint64_t budget, size_t staging_chunk)
    : budget_(budget), chunk_(std::max<size_t>(staging_chunk, 1)) {}

DeviceLayer::~DeviceLayer() = default;

uint64_t DeviceLayer::chunks_of(size_t width, size_t height, size_t chunk) {
  uint64_t n = 0;
  for_each_piece(width, height, chunk, [&](const Piece&) { ++n; });
  return n;
}

void* DeviceLayer::allocate(size_t bytes) {
  const uint64_t c = counted(bytes);
  if (auto it = pool_.find(c); it != pool_.end()) {
    const Pooled b = it->second;
    pool_.erase(it);
    pooled_ -= c;
    wait_fence(b.fence);  // the compute stream has passed the block's release
    return b.p;  // already held: in_use_ counts it
  }
  if (in_use_ + c > budget_) drain_pool();
  if (in_use_ + c > budget_)
    throw std::runtime_error(name() + ": allocating " + mib(c) + " would exceed the device memory budget of " +
                             mib(budget_) + " (" + mib(in_use_) + " in use; raise --device_memory)");
  void* p = raw_allocate(c);
  if (!p && !pool_.empty()) {
    drain_pool();
    p = raw_allocate(c);
  }
  if (!p) throw std::runtime_error(name() + ": out of device memory allocating " + mib(c));
  count(&OpTransfers::allocations, 1);
  in_use_ += c;
  if (in_use_ > peak_) peak_ = in_use_;
  return p;
}

void DeviceLayer::release(void* p, size_t bytes) {
  if (!p) return;
  pool_.emplace(counted(bytes), Pooled{p, fence_compute()});
  pooled_ += counted(bytes);
}

void DeviceLayer::drain_pool() {
  for (const auto& [c, b] : pool_) {
    drop_fence(b.fence);
    raw_release(b.p);  // cudaFree waits for the device: nothing reads the block any more
    in_use_ -= c;
  }
  pool_.clear();
  pooled_ = 0;
}

DeviceArena::DeviceArena(DeviceLayer& dev, size_t bytes) : dev_(dev), block_(dev, DeviceLayer::counted(bytes)) {
  if (block_.bytes()) free_[0] = Range{block_.bytes(), {}};
}

DeviceArena::~DeviceArena() {
  // The block goes back to the pool with an event of its own: these are no longer needed.
  for (const auto& [off, r] : free_)
    for (uint64_t f : r.fences) dev_.drop_fence(f);
}

size_t DeviceArena::free_bytes() const {
  size_t n = 0;
  for (const auto& [off, r] : free_) n += r.bytes;
  return n;
}

void* DeviceArena::take(size_t bytes) {
  const size_t c = DeviceLayer::counted(std::max<size_t>(bytes, 1));
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second.bytes < c) continue;
    const size_t off = it->first;
    Range r = std::move(it->second);
    free_.erase(it);
    for (uint64_t f : r.fences) dev_.wait_fence(f);  // the compute stream has passed those releases
    if (r.bytes > c) free_[off + c] = Range{r.bytes - c, {}};
    return block_.get() + off;
  }
  return nullptr;
}

void DeviceArena::give(void* p, size_t bytes) {
  if (!p) return;
  const size_t off = size_t(static_cast<uint8_t*>(p) - block_.get());
  Range r{DeviceLayer::counted(std::max<size_t>(bytes, 1)), {dev_.fence_compute()}};
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + r.bytes == next->first) {  // merge with the range after
    r.bytes += next->second.bytes;
    r.fences.insert(r.fences.end(), next->second.fences.begin(), next->second.fences.end());
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the range before
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes == off) {
      prev->second.bytes += r.bytes;
      prev->second.fences.insert(prev->second.fences.end(), r.fences.begin(), r.fences.end());
      return;
    }
  }
  free_[off] = std::move(r);
}

uint8_t* DeviceLayer::slot_for(Lane lane, int slot) {
  uint8_t*& b = ring_[lane][slot];
  if (!b) b = staging_allocate(chunk_);  // once, on first use
  return b;
}

void DeviceLayer::release_staging() {
  for (auto& lane : ring_)
    for (uint8_t*& b : lane) {
      if (b) staging_release(b);
      b = nullptr;
    }
}

void DeviceLayer::stage_in(Lane lane, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                           size_t height) {
  for_each_piece(width, height, chunk_, [&](const Piece& p) {
    const int s = next_slot_[lane];
    next_slot_[lane] = (s + 1) % kStagingSlots;
    slot_wait(lane, s);  // its previous DMA has read it
    in_flight_[lane][s] = false;
    uint64_t others = 0;
    for (bool b : in_flight_[lane]) others += b;
    if (others > in_flight_peak_[lane].load()) in_flight_peak_[lane] = others;  // this lane's thread only writes it
    uint8_t* buf = slot_for(lane, s);
    copy_rows(buf, p.width, static_cast<const uint8_t*>(src) + p.r0 * spitch + p.c0, spitch, p.width, p.rows);
    slot_to_device(lane, s, static_cast<uint8_t*>(dst) + p.r0 * dpitch + p.c0, dpitch, p.width, p.rows);
    in_flight_[lane][s] = true;
  });
}

void DeviceLayer::take_in_flight_peak(Lane lane, OpTransfers* op) {
  const uint64_t peak = in_flight_peak_[lane].exchange(0);
  for (OpTransfers* t : {&ledger_.total, op ? op : &ledger_.ops["(outside an operation)"]})
    t->uploads_in_flight = std::max(t->uploads_in_flight, peak);
}

void DeviceLayer::stage_out(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
  std::vector<Piece> pieces;
  for_each_piece(width, height, chunk_, [&](const Piece& p) { pieces.push_back(p); });
  // Slot of piece j: (first + j) % kStagingSlots. Up to kStagingSlots pieces in flight.
  const int first = next_slot_[kCopyLane];
  const auto slot_of = [&](size_t j) { return int((size_t(first) + j) % kStagingSlots); };
  const auto issue = [&](size_t j) {
    const Piece& p = pieces[j];
    slot_for(kCopyLane, slot_of(j));  // an earlier upload from it precedes on the same stream
    slot_from_device(slot_of(j), static_cast<const uint8_t*>(src) + p.r0 * spitch + p.c0, spitch, p.width, p.rows);
  };
  for (size_t j = 0; j < pieces.size() && j < size_t(kStagingSlots); ++j) issue(j);
  for (size_t j = 0; j < pieces.size(); ++j) {
    const Piece& p = pieces[j];
    slot_wait(kCopyLane, slot_of(j));
    copy_rows(static_cast<uint8_t*>(dst) + p.r0 * dpitch + p.c0, dpitch, slot_buffer(kCopyLane, slot_of(j)), p.width,
              p.width, p.rows);
    if (j + kStagingSlots < pieces.size()) issue(j + kStagingSlots);
  }
  next_slot_[kCopyLane] = slot_of(pieces.size());
  // The copy stream has passed its last copy, and every upload it ran before.
  for (bool& b : in_flight_[kCopyLane]) b = false;
}

void DeviceLayer::count_staged(uint64_t bytes, uint64_t chunks) {
  count(&OpTransfers::staged_bytes, bytes);
  count(&OpTransfers::staging_chunks, chunks);
}

void DeviceLayer::to_device(void* dst, const void* src, size_t bytes) { to_device_2d(dst, bytes, src, bytes, bytes, 1); }

void DeviceLayer::to_host(void* dst, const void* src, size_t bytes) { to_host_2d(dst, bytes, src, bytes, bytes, 1); }

void DeviceLayer::to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                               size_t height) {
  const uint64_t n = uint64_t(width) * height;
  count(&OpTransfers::h2d_bytes, n);
  if (n == 0) return;
  count_staged(n, chunks_of(width, height, chunk_));
  copy_after_compute();  // a buffer the compute stream still reads is not overwritten under it
  stage_in(kCopyLane, dst, dpitch, src, spitch, width, height);
  take_in_flight_peak(kCopyLane, op_);
  compute_after_copy();
}

void DeviceLayer::to_host_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                             size_t height) {
  const uint64_t n = uint64_t(width) * height;
  count(&OpTransfers::d2h_bytes, n);
  if (n == 0) return;
  count_staged(n, chunks_of(width, height, chunk_));
  copy_after_compute();
  stage_out(dst, dpitch, src, spitch, width, height);
}

Prefetch DeviceLayer::prefetch(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return {};
  count(&OpTransfers::h2d_bytes, bytes);
  count_staged(bytes, chunks_of(bytes, 1, chunk_));
  count(&OpTransfers::prefetches, 1);
  count(&OpTransfers::prefetch_bytes, bytes);
  const uint64_t t = next_ticket_++;
  prefetches_[t] = PrefetchRecord{bytes, ledger_.total.launches, op_ ? op_ : &ledger_.ops["(outside an operation)"]};
  start_prefetch(t, dst, src, bytes);
  return Prefetch(this, t);
}

void DeviceLayer::await_prefetch(uint64_t ticket) {
  const auto it = prefetches_.find(ticket);
  if (it == prefetches_.end()) return;
  const PrefetchRecord r = it->second;
  prefetches_.erase(it);
  if (ledger_.total.launches > r.launches_at_start) {  // compute was issued while it was in flight
    for (OpTransfers* t : {&ledger_.total, r.op}) {
      ++t->prefetches_overlapped;
      t->prefetch_bytes_overlapped += r.bytes;
    }
  }
  compute_after_prefetch(ticket);  // its copies are issued: the lane's depth is known
  take_in_flight_peak(kPrefetchLane, r.op);
}

void DeviceLayer::count_launch(uint64_t n) {
  count(&OpTransfers::launches, n);
  on_launch();
}

void DeviceLayer::count_flops(double fp32, double fp64) {
  count(&OpTransfers::flops, uint64_t(fp32));
  count(&OpTransfers::flops_fp64, uint64_t(fp64));
}

void DeviceLayer::count_host_fallback() {
  ledger_.total.host_fallback = true;
  if (op_) op_->host_fallback = true;
}

void DeviceLayer::count(uint64_t OpTransfers::*field, uint64_t n) {
  ledger_.total.*field += n;
  (op_ ? op_ : &ledger_.ops["(outside an operation)"])->*field += n;
}

void DeviceLayer::begin_op(const char* op) {
  if (op_depth_++ > 0) return;
  op_ = &ledger_.ops[op];
  op_name_ = op;
  ++op_->calls;
  ++ledger_.total.calls;
}

void DeviceLayer::end_op() {
  if (--op_depth_ == 0) op_ = nullptr, op_name_.clear();
}

std::string DeviceLayer::current_op() const { return op_name_.empty() ? "(outside an operation)" : op_name_; }

void DeviceLayer::fail(const std::string& what) const { throw std::runtime_error(name() + ": " + current_op() + ": " + what); }

}  // namespace nibble::kernels::gpu

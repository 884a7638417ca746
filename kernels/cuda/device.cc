#include "kernels/cuda/device.h"

#include <stdexcept>

namespace nibble::kernels::gpu {
namespace {

// Sizes in the units a budget is given in: MiB, or KiB below one MiB.
std::string mib(uint64_t b) {
  if (b < (uint64_t(1) << 20)) return std::to_string((b + 1023) >> 10) + " KiB";
  return std::to_string((b + (1u << 19)) >> 20) + " MiB";
}

}  // namespace

void* DeviceLayer::allocate(size_t bytes) {
  const uint64_t c = counted(bytes);
  if (auto it = pool_.find(c); it != pool_.end()) {
    void* p = it->second;
    pool_.erase(it);
    pooled_ -= c;
    return p;  // already held: in_use_ counts it
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
  pool_.emplace(counted(bytes), p);
  pooled_ += counted(bytes);
}

void DeviceLayer::drain_pool() {
  for (const auto& [c, p] : pool_) {
    raw_release(p);
    in_use_ -= c;
  }
  pool_.clear();
  pooled_ = 0;
}

void DeviceLayer::to_device(void* dst, const void* src, size_t bytes) {
  count(&OpTransfers::h2d_bytes, bytes);
  raw_to_device(dst, src, bytes);
}

void DeviceLayer::to_host(void* dst, const void* src, size_t bytes) {
  count(&OpTransfers::d2h_bytes, bytes);
  raw_to_host(dst, src, bytes);
}

void DeviceLayer::to_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                               size_t height) {
  count(&OpTransfers::h2d_bytes, uint64_t(width) * height);
  raw_to_device_2d(dst, dpitch, src, spitch, width, height);
}

void DeviceLayer::to_host_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                             size_t height) {
  count(&OpTransfers::d2h_bytes, uint64_t(width) * height);
  raw_to_host_2d(dst, dpitch, src, spitch, width, height);
}

void DeviceLayer::count_launch(uint64_t n) { count(&OpTransfers::launches, n); }

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
  ++op_->calls;
  ++ledger_.total.calls;
}

void DeviceLayer::end_op() {
  if (--op_depth_ == 0) op_ = nullptr;
}

}  // namespace nibble::kernels::gpu

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
  if (in_use_ + c > budget_)
    throw std::runtime_error(name() + ": allocating " + mib(c) + " would exceed the device memory budget of " +
                             mib(budget_) + " (" + mib(in_use_) + " in use; raise --device_memory)");
  void* p = raw_allocate(c);
  if (!p) throw std::runtime_error(name() + ": out of device memory allocating " + mib(c));
  in_use_ += c;
  if (in_use_ > peak_) peak_ = in_use_;
  return p;
}

void DeviceLayer::release(void* p, size_t bytes) {
  if (!p) return;
  raw_release(p);
  in_use_ -= counted(bytes);
}

}  // namespace nibble::kernels::gpu

// The one tensor handle of the kernels interface (ggml-backend's tensor in a backend buffer): an element
// type, a shape, and where the bytes are. Every array an operation reads from or leaves on a backend is a
// Tensor; the host owns none of the backend's memory and sees a buffer only as an opaque handle.
//
//   data     host bytes (a view into the caller's memory, or into `buffer` when that is host memory)
//   buffer   the backend's own storage of the same bytes (a device buffer), or the host memory an
//            operation's result lives in (HostArray, what the CPU backend makes); null: a borrowed view
//
// A tensor with only `data` is the host's; with a device buffer it is on the backend (and `data`, when
// set, is the host array it was uploaded from, valid while the handle lives). Backend::upload puts a
// host tensor on the backend, an operation's result stays where it was computed (kept), Backend::download
// brings one back, and release() drops the handle: the memory goes with its last handle.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace nibble::kernels {

// A backend's storage for a tensor. Opaque to the host; a device backend reads only its own buffers.
struct Buffer {
  virtual ~Buffer() = default;
};

// Host memory holding an operation's result (the CPU backend's buffers, and a device backend's results
// computed on the host).
template <class T>
struct HostArray final : Buffer {
  std::vector<T> values;
  explicit HostArray(std::vector<T>&& v) : values(std::move(v)) {}
};

struct Tensor {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::shared_ptr<const Buffer> buffer{};

  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return shape.empty() ? 0 : n;
  }
  size_t bytes() const { return size_t(elements()) * dtype_size(dtype); }
  // Whether the tensor holds anything at all (an operation that could not produce it returns an empty one).
  bool empty() const { return !data && !buffer; }
  const float* f32() const { return static_cast<const float*>(data); }
  const double* f64() const { return static_cast<const double*>(data); }
  void release() {
    data = nullptr;
    buffer.reset();
  }
};

// A tensor on host memory it owns (the values move into a HostArray), e.g. an operation's result on the CPU.
template <class T>
Tensor host_tensor(DType dtype, std::vector<int64_t> shape, std::vector<T>&& values) {
  auto b = std::make_shared<HostArray<T>>(std::move(values));
  Tensor t{dtype, std::move(shape), b->values.data(), {}};
  t.buffer = std::move(b);
  return t;
}

// A view of host memory the caller keeps alive (no buffer).
inline Tensor host_view(DType dtype, std::vector<int64_t> shape, const void* data) {
  return Tensor{dtype, std::move(shape), data, {}};
}

}  // namespace nibble::kernels

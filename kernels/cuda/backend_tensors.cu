// The CUDA backend's tensors (tensor.h; ggml-backend's tensors in a backend buffer): a weight uploaded
// once and read in place by every operation given it, W ⊙ s computed and left on the device for the
// quantizer that follows, a Gram matrix (or its blocks) and its Cholesky factor shared by the sibling
// weights that read one activation. Each falls back to the host form when it does not fit the device
// memory budget.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/launch.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

constexpr uint64_t kSlack = 64 * 1024;
constexpr size_t kWidenChunk = size_t(1) << 20;  // values per float32 chunk of upload_f64 (4 MiB)

}  // namespace

const DeviceArray* CudaBackend::mine(const std::shared_ptr<const Buffer>& r) const {
  const auto* a = dynamic_cast<const DeviceArray*>(r.get());
  return a && a->owner == this ? a : nullptr;
}

const uint8_t* CudaBackend::kept(const std::shared_ptr<const Buffer>& r) const {
  const DeviceArray* a = mine(r);
  if (!a) return nullptr;
  a->upload.await();  // a weight kept ahead: the compute stream waits for its upload
  return a->ptr();
}

const uint8_t* CudaBackend::weight_on_device(const WeightMatrix& w, DeviceBuffer<uint8_t>& tmp) {
  if (const uint8_t* d = kept(w.buffer)) return d;
  tmp = upload(static_cast<const uint8_t*>(w.data), size_t(w.rows * w.cols) * dtype_size(w.dtype));
  return tmp.get();
}

WeightMatrix CudaBackend::host_weight(const WeightMatrix& w, std::vector<uint8_t>& buf) {
  if (w.data) return w;
  const uint8_t* d = kept(w.buffer);
  if (!d) throw std::invalid_argument("a weight with neither host data nor this backend's device copy");
  buf.resize(size_t(w.rows * w.cols) * dtype_size(w.dtype));
  dev_->synchronize();
  dev_->to_host(buf.data(), d, buf.size());
  WeightMatrix h = w;
  h.data = buf.data();
  return h;
}

Tensor CudaBackend::upload(const Tensor& t) {
  const OpScope op(*dev_, "upload");
  if (mine(t.buffer) || !t.data) return t;
  const uint64_t bytes = t.bytes();
  const bool f64 = t.dtype == DType::kFloat64;
  // Half the budget at most, with what is held (a weight kept ahead beside the one computing): the
  // operations on it still need their panels beside it. A float64 tensor (a Gram matrix's blocks) a
  // quarter: the clip search's panels need the rest (else each weight uploads them).
  if (dev_->in_use_live() + bytes + kSlack > dev_->budget() / (f64 ? 4 : 2)) return t;
  auto a = std::make_shared<DeviceArray>();
  a->owner = this;
  a->data = DeviceBuffer<uint8_t>(*dev_, size_t(bytes));
  if (f64)
    upload_f64(reinterpret_cast<double*>(a->data.get()), t.f64(), size_t(t.elements()));
  else  // enqueued on the prefetch stream; the first operation that reads it waits (kept())
    a->upload = dev_->prefetch(a->data.get(), t.data, size_t(bytes));
  Tensor out = t;
  out.buffer = std::move(a);
  return out;
}

std::shared_ptr<Buffer> CudaBackend::reserve(const std::vector<uint64_t>& bytes) {
  const OpScope op(*dev_, "reserve");
  uint64_t total = 0;
  for (uint64_t b : bytes) total += DeviceLayer::counted(size_t(b));
  if (total == 0 || dev_->in_use_live() + total + kSlack > dev_->budget()) return {};
  auto r = std::make_shared<DeviceRoom>();
  r->owner = this;
  r->arena = std::make_shared<DeviceArena>(*dev_, size_t(total));
  return r;
}

Tensor CudaBackend::upload_into(const Tensor& t, const std::shared_ptr<Buffer>& room) {
  auto* r = dynamic_cast<DeviceRoom*>(room.get());
  if (!r || r->owner != this) return upload(t);
  const OpScope op(*dev_, "upload");
  if (mine(t.buffer) || !t.data) return t;
  const size_t bytes = t.bytes();
  auto* p = static_cast<uint8_t*>(r->arena->take(bytes));
  if (!p) return t;  // the room is full: the caller decides
  auto a = std::make_shared<DeviceArray>();
  a->owner = this;
  a->piece = std::make_unique<RoomPiece>(r->arena, p, bytes);
  a->upload = dev_->prefetch(p, t.data, bytes);  // as upload(): the first operation that reads it waits
  Tensor out = t;
  out.buffer = std::move(a);
  return out;
}

// The device's copy where this backend holds one (what it computed or was given), else the host bytes.
std::vector<uint8_t> CudaBackend::download(const Tensor& t) {
  const OpScope op(*dev_, "download");
  std::vector<uint8_t> out(t.bytes());
  if (const uint8_t* d = kept(t.buffer)) {
    dev_->synchronize();
    dev_->to_host(out.data(), d + mine(t.buffer)->offset, out.size());
    return out;
  }
  const auto* r = dynamic_cast<const DeviceResult*>(t.buffer.get());  // a kept quantization result: its codes
  if (r && r->owner == this && r->codes.bytes() == out.size()) {
    dev_->synchronize();
    dev_->to_host(out.data(), r->codes.get(), out.size());
    return out;
  }
  if (!t.data) throw std::invalid_argument("download: a tensor with neither host bytes nor this backend's buffer");
  std::memcpy(out.data(), t.data, out.size());
  return out;
}

Tensor CudaBackend::device_tensor(DeviceBuffer<float>&& b, int64_t rows, int64_t cols) {
  auto a = std::make_shared<DeviceArray>();
  a->owner = this;
  a->data = DeviceBuffer<uint8_t>::adopt(std::move(b));  // keeps the allocation's size for its release
  Tensor t{DType::kFloat32, {rows, cols}, nullptr, {}};
  t.buffer = std::move(a);
  return t;
}

WeightMatrix CudaBackend::scale_on_device(const WeightMatrix& w, const float* s, DType out_t, const char* op_name) {
  const int64_t n = w.rows * w.cols;
  const uint64_t in_bytes = mine(w.buffer) ? 0 : uint64_t(n) * dtype_size(w.dtype);
  // Beside what is held (the weights a whole-model search keeps for the quantizer, up to half the budget), with
  // a quarter of the budget left for the quantizer's panels.
  if (dev_->in_use_live() + in_bytes + uint64_t(n) * dtype_size(out_t) + uint64_t(w.K()) * 4 + kSlack >
      dev_->budget() / 4 * 3)
    return {};
  const OpScope op(*dev_, op_name);
  dev_->count_flops(double(n));
  DeviceBuffer<uint8_t> tmp;
  const uint8_t* in = weight_on_device(w, tmp);
  const DeviceBuffer<float> s_d = upload(s, size_t(w.K()));
  auto a = std::make_shared<DeviceArray>();
  a->owner = this;
  a->data = DeviceBuffer<uint8_t>(*dev_, size_t(n) * dtype_size(out_t));
  launch(*dev_, n, ScaleBody{in, int(w.dtype), int(out_t), w.cols, w.k_axis, s_d.get(), a->data.get()});
  WeightMatrix out = w;
  out.dtype = out_t;
  out.data = nullptr;  // only the device holds it
  out.buffer = std::move(a);
  return out;
}

void CudaBackend::upload_f64(double* dst, const double* src, size_t n) {
  // The staging chunk fits beside what is held (its size does not change the values that arrive).
  const uint64_t room = dev_->budget() - std::min(dev_->budget(), dev_->in_use_live() + kSlack);
  const size_t chunk = std::min({n, kWidenChunk, size_t(room / 4)});
  if (chunk < n && chunk < 1024) {
    dev_->to_device(dst, src, n * 8);
    return;
  }
  DeviceBuffer<float> stage(*dev_, chunk);
  std::vector<float> narrow(chunk);
  for (size_t i0 = 0; i0 < n; i0 += chunk) {
    const size_t m = std::min(chunk, n - i0);
    bool exact = true;  // NaN never compares equal: such a chunk goes up as float64
    for (size_t i = 0; i < m; ++i) {
      narrow[i] = float(src[i0 + i]);
      exact &= double(narrow[i]) == src[i0 + i];
    }
    if (!exact) {
      dev_->to_device(dst + i0, src + i0, m * 8);
      continue;
    }
    dev_->to_device(stage.get(), narrow.data(), m * 4);  // synchronous, after the last chunk's widening
    launch(*dev_, int64_t(m), WidenBody{stage.get(), dst + i0});
  }
  dev_->synchronize();
}

bool CudaBackend::upload_narrowed(float* dst, const double* src, size_t n) {
  for (size_t i = 0; i < n; ++i)  // NaN never compares equal: such an array stays float64
    if (double(float(src[i])) != src[i]) return false;
  std::vector<float> narrow(std::min(n, kWidenChunk));
  for (size_t i0 = 0; i0 < n; i0 += narrow.size()) {
    const size_t m = std::min(narrow.size(), n - i0);
    for (size_t i = 0; i < m; ++i) narrow[i] = float(src[i0 + i]);
    dev_->to_device(dst + i0, narrow.data(), m * 4);
  }
  return true;
}

DeviceBuffer<float> CudaBackend::cholesky_on_device(const double* gram, int64_t K, bool on_device,
                                                    DeviceBuffer<float>* gram_left) {
  double dmax = 0;  // the shift's scale: from K values on the host, or on the device where G is (8 bytes back)
  if (on_device) {
    DeviceBuffer<double> m(*dev_, 1);
    launch(*dev_, 1, MaxDiagonalBody{gram, K, m.get()});
    dmax = download(m)[0];
  }
  for (int64_t k = 0; !on_device && k < K; ++k) dmax = std::max(dmax, gram[k * K + k]);
  if (!(dmax > 0) || !std::isfinite(dmax)) return {};
  dev_->count_flops(double(K * K), double(K) * double(K) * double(K) / 3.0);  // dpotrf: K³/3 in fp64
  // A factor that does not fit the budget is not computed: no U selects the GEMM form, which streams
  // the Gram matrix in row panels.
  if (dev_->in_use_live() + uint64_t(K) * uint64_t(K) * 12 + 65536 > dev_->budget()) return {};
  DeviceBuffer<double> a(*dev_, size_t(K * K));
  // u holds G in float32 until the factor overwrites it: a retry widens it again, nothing crosses the bus.
  DeviceBuffer<float> u(*dev_, size_t(K * K));
  const bool narrow = !on_device && upload_narrowed(u.get(), gram, u.size());
  for (double shift : kCholeskyShifts) {
    if (on_device)  // a copy on the device: dpotrf overwrites a
      dev_->on_device_2d(a.get(), size_t(K) * 8, gram, size_t(K) * 8, size_t(K) * 8, size_t(K));
    else if (narrow)  // again on a retry: dpotrf overwrote a
      launch(*dev_, K * K, WidenBody{u.get(), a.get()});
    else
      dev_->to_device(a.get(), gram, a.bytes());
    if (shift > 0) launch(*dev_, K, ShiftDiagonalBody{a.get(), K, shift * dmax});
    // The row-major array read column-major is Gᵀ = G; the lower factor L (G = L Lᵀ), column-major,
    // is Lᵀ = U row-major.
    if (la().dpotrf(Fill::kLower, int(K), a.get(), int(K)) != 0) continue;
    launch(*dev_, K * K, UpperFloatBody{a.get(), K, u.get()});
    return u;
  }
  if (narrow && gram_left) *gram_left = std::move(u);  // G itself, untouched by the attempts
  return {};
}

GramFactor CudaBackend::gram_cholesky_upper(const Tensor& gram) {
  const OpScope op(*dev_, "gram_cholesky_upper");
  if (gram.dtype != DType::kFloat64 || gram.shape.size() != 2 || gram.shape[0] != gram.shape[1])
    throw std::invalid_argument("gram_cholesky_upper: a float64 K x K matrix");
  const int64_t K = gram.shape[0];
  const auto* on_device = reinterpret_cast<const double*>(kept(gram.buffer));
  if (!on_device && !gram.data)
    throw std::invalid_argument("gram_cholesky_upper: a Gram matrix held by another backend");
  DeviceBuffer<float> g32;
  DeviceBuffer<float> u = cholesky_on_device(on_device ? on_device : gram.f64(), K, on_device != nullptr, &g32);
  GramFactor f;
  // Kept for the GEMM form under upload's own rule (half the budget at most), else given back.
  if (!u.size() && g32.size() && dev_->in_use_live() + kSlack <= dev_->budget() / 2)
    f.gram = device_tensor(std::move(g32), K, K);
  if (u.size()) f.upper = device_tensor(std::move(u), K, K);
  return f;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

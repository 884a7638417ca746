// The CUDA backend's activation statistics (the layer engine's calibration): Σ|x| and the float64 fold as
// single-source kernels, the float32 products through the linear-algebra layer (cuBLAS on a GPU, OpenBLAS
// on the emulated device, which then gives the CPU backend's bits: the same column-major calls its row-major
// ones become). The sums stay on the device for the search; a statistic the budget cannot hold at its first
// batch stays in host memory, accumulated by the host backend (a host fallback in the ledger).
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/statistics_kernels.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

constexpr uint64_t kSlack = 64 * 1024;
constexpr int64_t kFiniteChunk = 4096;  // values per flag of all_finite

// A float64 array of this backend's own, zeroed.
std::shared_ptr<DeviceArray> zeros_f64(DeviceLayer& dev, const void* owner, int64_t n) {
  auto a = std::make_shared<DeviceArray>();
  a->owner = owner;
  a->data = DeviceBuffer<uint8_t>(dev, size_t(n) * 8);
  dev.fill_zero(a->data.get(), a->data.bytes());
  return a;
}

}  // namespace

// Statistics on the device where they fit in half the budget beside what is held (the search of them needs
// the rest), with room for one batch's rows and a product's panel.
bool CudaBackend::make_device_statistics(ActivationSums& s, int64_t rows) {
  const int64_t K = s.K, values = statistics_gram_values(K, s.gram_block);
  const uint64_t bytes = uint64_t(K + values) * 8 + uint64_t(rows) * uint64_t(K) * 4 +
                         uint64_t(K) * uint64_t(kStatisticsPanelColumns) * 4;
  if (dev_->in_use_live() + bytes + kSlack > dev_->budget() / 2) return false;
  Tensor sum{DType::kFloat64, {K}, nullptr, zeros_f64(*dev_, this, K)};
  Tensor gram{DType::kFloat64, {values}, nullptr, zeros_f64(*dev_, this, values)};
  s.sum_abs = std::move(sum);
  s.gram = std::move(gram);
  return true;
}

// One product of m rows X [m, K] (row-major, on the device) into the sums: the CPU backend's row-major
// calls as the column-major ones they are (sgemm N/T of the panel against the columns left of it, ssyrk
// lower/N of the panel), each folded into float64 by a kernel.
void CudaBackend::statistics_product(const float* X, int64_t m, int64_t K, int64_t B, double* gram, float* g) {
  const int k = int(K), n = int(m);
  if (B) {
    for (int64_t b = 0; b < num_blocks(K, B); ++b) {
      const int64_t w = std::min(B, K - b * B);
      la().ssyrk(Fill::kLower, Op::kN, int(w), n, 1.0f, X + b * B, k, 0.0f, g, int(w));
      launch(*dev_, w * w, FoldBlockBody{g, w, B, gram + b * B * B});
    }
    return;
  }
  for (int64_t j0 = 0; j0 < K; j0 += kStatisticsPanelColumns) {
    const int64_t w = std::min(kStatisticsPanelColumns, K - j0);
    if (j0) la().sgemm(Op::kN, Op::kT, int(w), int(j0), n, 1.0f, X + j0, k, X, k, 0.0f, g, int(w));
    la().ssyrk(Fill::kLower, Op::kN, int(w), n, 1.0f, X + j0, k, 0.0f, g + j0 * w, int(w));
    launch(*dev_, (j0 + w) * w, FoldPanelBody{g, j0, w, K, gram});
  }
}

void CudaBackend::accumulate_statistics(const Tensor& x, ActivationSums& s) {
  if (x.dtype != DType::kFloat32 || x.shape.size() != 2 || x.shape[1] != s.K || s.K <= 0)
    throw std::invalid_argument("accumulate_statistics: x must be float32 [n, K]");
  const int64_t n = x.shape[0], K = s.K, B = s.gram_block;
  if (s.gram.empty()) make_device_statistics(s, mine(x.buffer) ? 0 : n);  // else made on the host below
  if (!mine(s.gram.buffer)) {  // held on the host since the first batch
    std::vector<uint8_t> buf;
    Tensor xh = x;
    if (!x.data) {
      buf = download(x);
      xh = host_view(DType::kFloat32, x.shape, buf.data());
    }
    return on_host("accumulate_statistics", [&](Backend& h) { h.accumulate_statistics(xh, s); });
  }
  const OpScope op(*dev_, "accumulate_statistics");
  double products = 0;
  for (int64_t b = 0; B && b < num_blocks(K, B); ++b) {
    const double w = double(std::min(B, K - b * B));
    products += w * (w + 1);
  }
  dev_->count_flops(double(n) * double(K) + double(n) * (B ? products : double(K) * double(K + 1)));
  DeviceBuffer<float> tmp;
  const float* X = reinterpret_cast<const float*>(kept(x.buffer));
  if (!X && n > 0) {  // not uploaded (it did not fit beside what is held): the rows go up here, once
    tmp = upload(x.f32(), size_t(n * K));
    X = tmp.get();
  }
  launch(*dev_, K, SumAbsBody{X, n, K, reinterpret_cast<double*>(mine(s.sum_abs.buffer)->ptr())});
  DeviceBuffer<float> g(*dev_, size_t(B ? B * B : K * std::min(K, kStatisticsPanelColumns)));
  double* gram = reinterpret_cast<double*>(mine(s.gram.buffer)->ptr());
  for (int64_t r0 = 0; r0 < n; r0 += kStatisticsRowsPerProduct)
    statistics_product(X + r0 * K, std::min(kStatisticsRowsPerProduct, n - r0), K, B, gram, g.get());
  dev_->synchronize();  // the scratch and the rows go when this returns
  s.rows += n;
}

Tensor CudaBackend::unpack_gram(const Tensor& packed, int64_t K) {
  if (packed.elements() != packed_row(K, K))
    throw std::invalid_argument("unpack_gram: not a packed triangle of order K");
  const DeviceArray* a = mine(packed.buffer);
  if (!a || dev_->in_use_live() + uint64_t(K) * uint64_t(K) * 8 + kSlack > dev_->budget() / 2) {
    // On the host, or beyond the budget beside it: unfolded on the host (what a device cannot hold).
    std::vector<uint8_t> buf;
    Tensor ph = packed;
    if (!packed.data) {
      buf = download(packed);
      ph = host_view(DType::kFloat64, packed.shape, buf.data());
    }
    return on_host("unpack_gram", [&](Backend& h) { return h.unpack_gram(ph, K); });
  }
  const OpScope op(*dev_, "unpack_gram");
  auto out = std::make_shared<DeviceArray>();
  out->owner = this;
  out->data = DeviceBuffer<uint8_t>(*dev_, size_t(K * K) * 8);
  launch(*dev_, K * K, UnpackGramBody{reinterpret_cast<const double*>(a->ptr()), K,
                                      reinterpret_cast<double*>(out->data.get())});
  return Tensor{DType::kFloat64, {K, K}, nullptr, std::move(out)};
}

Tensor CudaBackend::gram_to_f32(const Tensor& gram) {
  if (gram.dtype != DType::kFloat64) throw std::invalid_argument("gram_to_f32: a float64 tensor");
  const int64_t n = gram.elements();
  const DeviceArray* a = mine(gram.buffer);
  if (!a || dev_->in_use_live() + uint64_t(n) * 4 + kSlack > dev_->budget() / 2) {
    std::vector<uint8_t> buf;
    Tensor gh = gram;
    if (!gram.data) {
      buf = download(gram);
      gh = host_view(DType::kFloat64, gram.shape, buf.data());
    }
    return on_host("gram_to_f32", [&](Backend& h) { return h.gram_to_f32(gh); });
  }
  const OpScope op(*dev_, "gram_to_f32");
  auto out = std::make_shared<DeviceArray>();
  out->owner = this;
  out->data = DeviceBuffer<uint8_t>(*dev_, size_t(n) * 4);
  launch(*dev_, n, NarrowBody{reinterpret_cast<const double*>(a->ptr()), reinterpret_cast<float*>(out->data.get())});
  return Tensor{DType::kFloat32, gram.shape, nullptr, std::move(out)};
}

bool CudaBackend::all_finite(const Tensor& t) {
  if (t.dtype != DType::kFloat64) throw std::invalid_argument("all_finite: a float64 tensor");
  const DeviceArray* a = mine(t.buffer);
  if (!a) return on_host("all_finite", [&](Backend& h) { return h.all_finite(t); });
  const OpScope op(*dev_, "all_finite");
  const int64_t n = t.elements(), chunks = num_blocks(n, kFiniteChunk);
  DeviceBuffer<uint8_t> flags(*dev_, size_t(chunks));
  launch(*dev_, chunks, FiniteChunkBody{reinterpret_cast<const double*>(a->ptr()), n, kFiniteChunk, flags.get()});
  const std::vector<uint8_t> back = download(flags);  // one byte per chunk
  return std::all_of(back.begin(), back.end(), [](uint8_t f) { return f != 0; });
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

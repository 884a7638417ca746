// The CUDA backend's forward operations (the layer engine's activations on the device): element-wise,
// norm and attention bodies as single-source kernels (forward_kernels.h), the products through the
// linear-algebra layer in the calls the CPU makes (forward_matmul_sgemm's panels, the attention's products
// per (batch, kv head) as one strided batch), so that the emulated device's OpenBLAS gives the CPU's bits.
// A result the budget cannot hold is computed on the host (a host fallback in the ledger) and stays there.
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/forward_kernels.h"
#include "kernels/cuda/launch.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

constexpr uint64_t kSlack = 64 * 1024;

bool is_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16; }

}  // namespace

const float* CudaBackend::forward_input(const Tensor& t, DeviceBuffer<float>& tmp) {
  if (!is_float(t.dtype)) throw std::invalid_argument("forward: a float32, fp16 or bf16 tensor");
  const int64_t n = t.elements();
  const uint8_t* d = kept(t.buffer);
  if (d && t.dtype == DType::kFloat32) return reinterpret_cast<const float*>(d + mine(t.buffer)->offset);
  DeviceBuffer<uint8_t> raw;
  if (!d) {  // host bytes: they go up here
    if (!t.data && n > 0) throw std::invalid_argument("forward: a tensor with neither host bytes nor this backend's buffer");
    if (t.dtype == DType::kFloat32) {
      tmp = upload(t.f32(), size_t(n));
      return tmp.get();
    }
    raw = upload(static_cast<const uint8_t*>(t.data), t.bytes());
    d = raw.get();
  } else {
    d += mine(t.buffer)->offset;
  }
  tmp = DeviceBuffer<float>(*dev_, size_t(n));
  launch(*dev_, n, WidenBody{d, int(t.dtype), tmp.get()});  // `raw` is released behind the launch
  return tmp.get();
}

Tensor CudaBackend::forward_result(DeviceBuffer<float>&& b, std::vector<int64_t> shape) {
  auto a = std::make_shared<DeviceArray>();
  a->owner = this;
  a->data = DeviceBuffer<uint8_t>::adopt(std::move(b));
  Tensor t{DType::kFloat32, std::move(shape), nullptr, {}};
  t.buffer = std::move(a);
  return t;
}

bool CudaBackend::forward_fits(uint64_t bytes) const { return dev_->in_use_live() + bytes + kSlack <= dev_->budget(); }

Tensor CudaBackend::forward_host_copy(const Tensor& t) {
  if (!mine(t.buffer)) return t;
  std::vector<uint8_t> raw = download(t);
  std::vector<float> v(raw.size() / sizeof(float));
  std::memcpy(v.data(), raw.data(), raw.size());
  return host_tensor(DType::kFloat32, t.shape, std::move(v));
}

Tensor CudaBackend::forward_widen(const Tensor& t) {
  if (!forward_fits(uint64_t(t.elements()) * 8))
    return on_host("forward_widen", [&](Backend& h) { return h.forward_widen(forward_host_copy(t)); });
  if (mine(t.buffer) && t.dtype == DType::kFloat32) return t;
  const OpScope op(*dev_, "forward_widen");
  DeviceBuffer<float> tmp;
  forward_input(t, tmp);
  return forward_result(std::move(tmp), t.shape);
}

Tensor CudaBackend::forward_round(const Tensor& x, DType to) {
  const int64_t n = x.elements();
  if (!forward_fits(uint64_t(n) * 8))
    return on_host("forward_round", [&](Backend& h) { return h.forward_round(forward_host_copy(x), to); });
  const OpScope op(*dev_, "forward_round");
  DeviceBuffer<float> tmp;
  const float* in = forward_input(x, tmp);
  DeviceBuffer<float> y(*dev_, size_t(n));
  launch(*dev_, n, RoundBody{in, int(to), y.get()});
  return forward_result(std::move(y), x.shape);
}

Tensor CudaBackend::forward_select_rows(const Tensor& x, const std::vector<int64_t>& counted) {
  if (x.shape.size() != 2 || int64_t(counted.size()) != x.shape[0])
    throw std::invalid_argument("forward_select_rows: x [n, K] and n flags");
  const int64_t K = x.shape[1];
  std::vector<int64_t> rows;
  for (size_t r = 0; r < counted.size(); ++r)
    if (counted[r]) rows.push_back(int64_t(r));
  const int64_t n = int64_t(rows.size());
  if (!forward_fits(uint64_t(n * K) * 4 + uint64_t(n) * 8))
    return on_host("forward_select_rows", [&](Backend& h) { return h.forward_select_rows(forward_host_copy(x), counted); });
  const OpScope op(*dev_, "forward_select_rows");
  DeviceBuffer<float> tmp;
  const float* in = forward_input(x, tmp);
  DeviceBuffer<float> y(*dev_, size_t(n * K));
  if (n > 0) {
    const DeviceBuffer<int64_t> idx = upload(rows.data(), rows.size());
    launch(*dev_, n * K, SelectRowsBody{in, idx.get(), K, y.get()});
  }
  return forward_result(std::move(y), {n, K});
}

Tensor CudaBackend::forward_strided(const Tensor& x, const Strided& g) {
  const int64_t n = g.elements();
  std::vector<int64_t> shape(g.out, g.out + g.rank);
  if (!forward_fits(uint64_t(n) * 4))
    return on_host("forward_strided", [&](Backend& h) { return h.forward_strided(forward_host_copy(x), g); });
  int64_t lo = g.base, hi = g.base;  // the elements read: checked here, not by every thread
  for (int d = 0; d < g.rank; ++d)
    if (g.out[d] > 0) (g.stride[d] < 0 ? lo : hi) += (g.out[d] - 1) * g.stride[d];
  if (n > 0 && (lo < 0 || hi >= x.elements())) throw std::invalid_argument("forward_strided: an element outside x");
  const OpScope op(*dev_, "forward_strided");
  DeviceBuffer<float> tmp;
  const float* in = forward_input(x, tmp);
  DeviceBuffer<float> y(*dev_, size_t(n));
  launch(*dev_, n, StridedBody{g, in, y.get()});
  return forward_result(std::move(y), std::move(shape));
}

Tensor CudaBackend::forward_reduce_rows(const Tensor& x, int64_t width, bool mean) {
  if (width <= 0 || x.elements() % width) throw std::invalid_argument("forward_reduce_rows: rows of the width");
  const int64_t rows = x.elements() / width;
  if (!forward_fits(uint64_t(rows) * 4))
    return on_host("forward_reduce_rows", [&](Backend& h) { return h.forward_reduce_rows(forward_host_copy(x), width, mean); });
  const OpScope op(*dev_, "forward_reduce_rows");
  DeviceBuffer<float> tmp;
  const float* in = forward_input(x, tmp);
  DeviceBuffer<float> y(*dev_, size_t(rows));
  launch(*dev_, rows, ReduceRowsBody{in, width, mean, y.get()});
  return forward_result(std::move(y), {rows});
}

Tensor CudaBackend::forward_softmax_rows(const Tensor& x, int64_t width) {
  const int64_t n = x.elements();
  if (width <= 0 || n % width) throw std::invalid_argument("forward_softmax_rows: rows of the width");
  if (!forward_fits(uint64_t(n) * 4))
    return on_host("forward_softmax_rows", [&](Backend& h) { return h.forward_softmax_rows(forward_host_copy(x), width); });
  const OpScope op(*dev_, "forward_softmax_rows");
  DeviceBuffer<float> tmp;
  const float* in = forward_input(x, tmp);
  DeviceBuffer<float> y(*dev_, size_t(n));
  launch(*dev_, n, RoundBody{in, int(DType::kFloat32), y.get()});  // a copy to work in
  launch(*dev_, n / width, SoftmaxRowsBody{y.get(), width});
  return forward_result(std::move(y), x.shape);
}

Tensor CudaBackend::forward_binary(ForwardBinary op_kind, const Tensor& a, const Tensor& b) {
  const Broadcast g = broadcast_of(a.shape, b.shape);
  if (!forward_fits(uint64_t(g.elements()) * 4))
    return on_host("forward_binary",
                   [&](Backend& h) { return h.forward_binary(op_kind, forward_host_copy(a), forward_host_copy(b)); });
  const OpScope op(*dev_, "forward_binary");
  DeviceBuffer<float> ta, tb;
  const float* x = forward_input(a, ta);
  const float* y = forward_input(b, tb);
  DeviceBuffer<float> out(*dev_, size_t(g.elements()));
  launch(*dev_, g.elements(), BinaryBody{g, op_kind, x, y, out.get()});
  return forward_result(std::move(out), g.shape());
}

Tensor CudaBackend::forward_unary(ForwardUnary op_kind, const Tensor& x) {
  const int64_t n = x.elements();
  if (!forward_fits(uint64_t(n) * 4))
    return on_host("forward_unary", [&](Backend& h) { return h.forward_unary(op_kind, forward_host_copy(x)); });
  const OpScope op(*dev_, "forward_unary");
  DeviceBuffer<float> tmp;
  const float* in = forward_input(x, tmp);
  DeviceBuffer<float> y(*dev_, size_t(n));
  launch(*dev_, n, UnaryBody{op_kind, in, y.get()});
  return forward_result(std::move(y), x.shape);
}

std::vector<Tensor> CudaBackend::forward_norm(const NormArgs& a) {
  const int64_t n = a.x.elements(), W = a.width;
  if (W <= 0 || n % W || (!a.l2 && a.gamma.elements() != W) || (!a.skip.empty() && a.skip.elements() != n))
    throw std::invalid_argument("forward_norm: rows of the width, gamma of it, skip of x's shape");
  if (!forward_fits(uint64_t(n) * (a.with_sum ? 8 : 4))) {
    NormArgs h = a;
    for (Tensor* t : {&h.x, &h.skip, &h.bias, &h.gamma, &h.beta}) *t = forward_host_copy(*t);
    return on_host("forward_norm", [&](Backend& host) { return host.forward_norm(h); });
  }
  const OpScope op(*dev_, "forward_norm");
  DeviceBuffer<float> tx, ts, tb, tg, tbeta;
  const float* x = forward_input(a.x, tx);
  const float* skip = a.skip.empty() ? nullptr : forward_input(a.skip, ts);
  const float* bias = a.bias.empty() ? nullptr : forward_input(a.bias, tb);
  const float* gamma = a.l2 ? nullptr : forward_input(a.gamma, tg);
  const float* beta = a.beta.empty() ? nullptr : forward_input(a.beta, tbeta);
  DeviceBuffer<float> y(*dev_, size_t(n)), sum;
  if (a.with_sum) sum = DeviceBuffer<float>(*dev_, size_t(n));
  launch(*dev_, n / W, NormBody{x, skip, bias, gamma, beta, W, a.eps, a.rms, int(a.round), y.get(), sum.get(), a.l2});
  std::vector<Tensor> out{forward_result(std::move(y), a.x.shape)};
  if (a.with_sum) out.push_back(forward_result(std::move(sum), a.x.shape));
  return out;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

// The CUDA backend's element-wise operations, AWQ statistics and packings: upload, one launch,
// download. Element-wise operations stream the weight through the device in row panels.
#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pack_kernels.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

enum Mode { kScale = 0, kScaleF32 = 1, kDivide = 2 };

}  // namespace

std::string CudaBackend::describe() const {
  const uint64_t b = dev_->budget();
  return dev_->describe() + ", " + la_->name() + ", device memory budget " +
         (b < (uint64_t(1) << 20) ? std::to_string(b >> 10) + " KiB" : std::to_string(b >> 20) + " MiB");
}

// One element-wise operation over row panels of the stored layout. `v` is indexed by stored row
// (k_axis 0 scaling, k_axis 1 division) or by stored column (the other two): a row panel takes its
// slice of the first kind whole.
std::vector<uint8_t> CudaBackend::elementwise(const WeightMatrix& w, const float* v, size_t v_len, int mode) {
  const DType out_t = mode == kScaleF32 ? DType::kFloat32 : w.dtype;
  const size_t in_sz = dtype_size(w.dtype), out_sz = dtype_size(out_t);
  std::vector<uint8_t> out(size_t(w.rows * w.cols) * out_sz);
  const DeviceBuffer<float> v_d = upload(v, v_len);
  const bool by_row = (mode == kDivide) == (w.k_axis == 1);
  const int64_t panel = panel_width(0, uint64_t(w.cols) * (in_sz + out_sz), w.rows, "element-wise");
  for (int64_t r0 = 0; r0 < w.rows; r0 += panel) {
    const int64_t nr = std::min(panel, w.rows - r0), n = nr * w.cols;
    DeviceBuffer<uint8_t> in(*dev_, size_t(n) * in_sz), res(*dev_, size_t(n) * out_sz);
    if (const uint8_t* d = kept(w.buffer))
      dev_->on_device_2d(in.get(), in.bytes(), d + size_t(r0 * w.cols) * in_sz, in.bytes(), in.bytes(), 1);
    else
      dev_->to_device(in.get(), static_cast<const uint8_t*>(w.data) + size_t(r0 * w.cols) * in_sz, in.bytes());
    const float* vp = v_d.get() + (by_row ? r0 : 0);
    if (mode == kDivide)
      launch(*dev_, n, DivideColumnsBody{in.get(), int(w.dtype), w.cols, w.k_axis, vp, res.get()});
    else  // ScaleBody indexes s by i / cols for k_axis 0: rows of this panel, hence the offset
      launch(*dev_, n, ScaleBody{in.get(), int(w.dtype), int(out_t), w.cols, w.k_axis, vp, res.get()});
    dev_->synchronize();
    dev_->to_host(out.data() + size_t(r0 * w.cols) * out_sz, res.get(), res.bytes());
  }
  return out;
}

// W ⊙ s left on the device for what follows; where it does not fit beside what is held, it streams in row
// panels through the host and the result is host memory.
WeightMatrix CudaBackend::scale_weight(const WeightMatrix& w, const float* s) {
  WeightMatrix out = scale_on_device(w, s, w.dtype, "scale_weight");
  if (out.buffer) return out;
  const OpScope op(*dev_, "scale_weight");
  dev_->count_flops(double(w.rows * w.cols));
  return WeightMatrix::of(host_tensor(w.dtype, {w.rows, w.cols}, elementwise(w, s, size_t(w.K()), kScale)), w.k_axis);
}
WeightMatrix CudaBackend::scale_weight_f32(const WeightMatrix& w, const float* s) {
  WeightMatrix out = scale_on_device(w, s, DType::kFloat32, "scale_weight_f32");
  if (out.buffer) return out;
  const OpScope op(*dev_, "scale_weight_f32");
  dev_->count_flops(double(w.rows * w.cols));
  return WeightMatrix::of(host_tensor(DType::kFloat32, {w.rows, w.cols}, elementwise(w, s, size_t(w.K()), kScaleF32)),
                          w.k_axis);
}
std::vector<float> CudaBackend::awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean,
                                          double alpha) {
  return on_host("awq_scale", [&](Backend& h) { return h.awq_scale(x_mean, w_mean, alpha); });
}
std::vector<uint8_t> CudaBackend::divide_columns(const WeightMatrix& w, const float* d) {
  const OpScope op(*dev_, "divide_columns");
  dev_->count_flops(double(w.rows * w.cols));
  return elementwise(w, d, size_t(w.N()), kDivide);
}

std::vector<float> CudaBackend::awq_weight_mean(const WeightMatrix& w, int64_t block, bool contiguous) {
  const OpScope op(*dev_, "awq_weight_mean");
  dev_->count_flops(3.0 * double(w.rows * w.cols));
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, block), M = contiguous ? G * N : G * block * N / block;
  DeviceBuffer<uint8_t> tmp;
  const WeightView v{weight_on_device(w, tmp), int(w.dtype), w.rows, w.cols, w.k_axis};
  DeviceBuffer<float> amax(*dev_, size_t(M)), mean(*dev_, size_t(K));
  launch(*dev_, M, GroupAmaxBody{v, block, M, contiguous, amax.get()});
  launch(*dev_, K, WeightMeanBody{v, block, M, contiguous, amax.get(), mean.get()});
  return download(mean);
}

std::vector<float> CudaBackend::mean_of(const std::vector<const std::vector<float>*>& v) {
  const OpScope op(*dev_, "mean_of");
  if (v.empty()) return {};
  const int64_t m = int64_t(v.size()), K = int64_t(v[0]->size());
  DeviceBuffer<float> in(*dev_, size_t(m * K)), out(*dev_, size_t(K));
  for (int64_t j = 0; j < m; ++j) dev_->to_device(in.get() + j * K, v[size_t(j)]->data(), size_t(K) * 4);
  launch(*dev_, K, MeanOfBody{in.get(), m, K, out.get()});
  return download(out);
}

std::vector<float> CudaBackend::channel_energy(const Tensor& gram, const float* s) {
  const OpScope op(*dev_, "channel_energy");
  if (gram.dtype != DType::kFloat64 || gram.shape.size() != 2 || gram.shape[0] != gram.shape[1])
    throw std::invalid_argument("channel_energy: a float64 K x K matrix");
  const int64_t K = gram.shape[0];
  // The diagonal alone: read on the device where G is (the layer engine's), else a 2-D copy of one element
  // per row goes up.
  DeviceBuffer<double> diag(*dev_, size_t(K));
  if (const uint8_t* d = kept(gram.buffer))
    dev_->on_device_2d(diag.get(), 8, d, size_t(K + 1) * 8, 8, size_t(K));
  else if (gram.data)
    dev_->to_device_2d(diag.get(), 8, gram.f64(), size_t(K + 1) * 8, 8, size_t(K));
  else
    throw std::invalid_argument("channel_energy: a Gram matrix held by another backend");
  const DeviceBuffer<float> s_d = s ? upload(s, size_t(K)) : DeviceBuffer<float>();
  DeviceBuffer<float> out(*dev_, size_t(K));
  launch(*dev_, K, EnergyF64Body{diag.get(), s ? s_d.get() : nullptr, out.get()});
  return download(out);
}

std::vector<uint8_t> CudaBackend::pack_onnx(const std::vector<uint8_t>& codes, int bits) {
  const OpScope op(*dev_, "pack_onnx");
  if (bits == 8) return codes;
  if (bits != 4) throw std::invalid_argument("pack_onnx: bits must be 4 or 8");
  const int64_t n = int64_t(codes.size());
  std::vector<uint8_t> out(size_t((n + 1) / 2));
  // In chunks of an even number of codes (3 bytes of device memory per code pair) within the budget.
  const int64_t pairs = panel_width(0, 3, (n + 1) / 2, "pack_onnx");
  for (int64_t c0 = 0; c0 < n; c0 += 2 * pairs) {
    const int64_t cn = std::min(2 * pairs, n - c0), bytes = (cn + 1) / 2;
    const DeviceBuffer<uint8_t> in = upload(codes.data() + c0, size_t(cn));
    DeviceBuffer<uint8_t> res(*dev_, size_t(bytes));
    launch(*dev_, bytes, PackOnnxBody{in.get(), cn, res.get()});
    dev_->synchronize();
    dev_->to_host(out.data() + c0 / 2, res.get(), res.bytes());
  }
  return out;
}

std::vector<uint8_t> CudaBackend::pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                                          const QuantResult& q, int64_t layout_block) {
  const OpScope op(*dev_, "pack_matmulnbits_weight");
  const int64_t K = shape.K(), N = shape.N(), G = q.groups;
  if (layout_block != spec.block && G != 1)
    throw std::invalid_argument("pack_matmulnbits_weight: padded layout needs a single block");
  const int64_t blob = layout_block * spec.bits / 8;
  const DeviceResult* r = kept_result(q);  // the quantizer left codes and zero points here: nothing goes up
  // Else the 4-bit codes go up packed when the quantizer brought them back so (half the bytes).
  const bool packed = !r && spec.bits == 4 && !q.packed.empty() && q.packed.size() == (q.codes.size() + 1) / 2;
  DeviceBuffer<uint8_t> codes, zp;
  if (!r) codes = packed ? upload(q.packed.data(), q.packed.size()) : upload(q.codes.data(), q.codes.size());
  if (!r && spec.zero_point) zp = upload(q.zero_points.data(), q.zero_points.size());
  const uint8_t* codes_d = r ? r->codes.get() : codes.get();
  const uint8_t* zp_d = !spec.zero_point ? nullptr : r ? r->zero_points.get() : zp.get();
  DeviceBuffer<uint8_t> out(*dev_, size_t(N * G * blob));
  const ParamLayout l{K, N, G, shape.k_axis};
  launch(*dev_, N * G * blob,
         PackNBitsBody{l, codes_d, zp_d, packed, spec.bits, spec.block, layout_block, blob, out.get()});
  return download(out);
}

std::vector<float> CudaBackend::matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q) {
  const OpScope op(*dev_, "matmulnbits_scales");
  const int64_t N = shape.N(), G = q.groups;
  const DeviceResult* r = kept_result(q);
  const DeviceBuffer<float> in = r ? DeviceBuffer<float>() : upload(q.scales.data(), q.scales.size());
  DeviceBuffer<float> out(*dev_, size_t(N * G));
  launch(*dev_, N * G, NBitsScalesBody{ParamLayout{shape.K(), N, G, shape.k_axis}, r ? r->scales.get() : in.get(),
                                       out.get()});
  const int st = r ? r->scale_dtype : 0;
  if (st != hd::kF16 && st != hd::kBF16) return download(out);
  // Kept scales of a 16-bit type come back in it (exact: the quantizer rounded them to it), as the
  // quantizer would have brought them.
  DeviceBuffer<uint16_t> narrow(*dev_, size_t(N * G));
  launch(*dev_, N * G, NarrowScalesBody{out.get(), st, narrow.get()});
  const std::vector<uint16_t> h = download(narrow);
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = st == hd::kF16 ? hd::half_to_float(h[i]) : hd::bf16_to_float(h[i]);
  return v;
}

std::vector<uint8_t> CudaBackend::pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                               const QuantResult& q) {
  const OpScope op(*dev_, "pack_matmulnbits_zero_points");
  const int64_t N = shape.N(), G = q.groups, row = spec.bits == 8 ? G : (G + 1) / 2;
  const DeviceResult* r = kept_result(q);
  const DeviceBuffer<uint8_t> in = r ? DeviceBuffer<uint8_t>() : upload(q.zero_points.data(), q.zero_points.size());
  DeviceBuffer<uint8_t> out(*dev_, size_t(N * row));
  launch(*dev_, N * row, NBitsZeroPointsBody{ParamLayout{shape.K(), N, G, shape.k_axis},
                                             r ? r->zero_points.get() : in.get(), spec.bits, row, out.get()});
  return download(out);
}

std::vector<uint8_t> CudaBackend::dequantize(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q,
                                             DType out_t) {
  const OpScope op(*dev_, "dequantize");
  dev_->count_flops(2.0 * double(shape.rows * shape.cols));
  const int64_t K = shape.K(), N = shape.N(), G = q.groups, n = shape.rows * shape.cols;
  if (q.codes.size() != size_t(n) || q.scales.size() != size_t(G * N) || spec.block < 1 ||
      (spec.zero_point && q.zero_points.size() != q.scales.size()))
    throw std::invalid_argument("dequantize: codes, scales or zero points do not match the weight's shape");
  const DeviceBuffer<uint8_t> codes = upload(q.codes.data(), q.codes.size());
  const DeviceBuffer<float> scales = upload(q.scales.data(), q.scales.size());
  const DeviceBuffer<uint8_t> zp =
      spec.zero_point ? upload(q.zero_points.data(), q.zero_points.size()) : DeviceBuffer<uint8_t>();
  DeviceBuffer<uint8_t> res(*dev_, size_t(n) * dtype_size(out_t));
  launch(*dev_, n, DequantizeBody{ParamLayout{K, N, G, shape.k_axis}, spec.block, codes.get(), scales.get(),
                                  spec.zero_point ? zp.get() : nullptr, int(out_t), res.get()});
  return download(res);
}

std::unique_ptr<Backend> make(std::unique_ptr<DeviceLayer> dev, std::unique_ptr<LinAlg> la,
                              std::unique_ptr<Backend> host) {
  return std::make_unique<CudaBackend>(std::move(dev), std::move(la), std::move(host));
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

// The CUDA backend's RTN family and Gram clip search: the weight goes to the device in column panels
// that fit the memory budget (blocks run along K, so columns are independent), one thread per
// (block, column) quantizes, and the results come back into the host layout.
#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/clip_kernels.h"
#include "kernels/cuda/hqq_kernels.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pack_kernels.h"
#include "kernels/cuda/rtn_blocks.h"
#include "kernels/parallel.h"
#include "kernels/cuda/search_kernels.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

void check(const QuantSpec& spec) {
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
}
BlockShape shape_of(const QuantSpec& spec, DType data) {
  return BlockShape{spec.bits, spec.block, spec.zero_point, int(scale_type(spec, data))};
}
// Plain RTN's, the one operation that reads QuantSpec::rtn_arithmetic.
BlockShape rtn_shape_of(const QuantSpec& spec, DType data) {
  BlockShape s = shape_of(spec, data);
  s.ort = spec.rtn_arithmetic == RtnArithmetic::kOnnxRuntime;
  return s;
}

}  // namespace

int64_t CudaBackend::panel_width(uint64_t fixed, uint64_t per_column, int64_t N, const char* what) const {
  // Each buffer may round up by 256 bytes; a few KiB of slack covers that.
  const uint64_t slack = 16 * 1024, used = dev_->in_use_live() + fixed + slack;
  const uint64_t avail = dev_->budget() > used ? dev_->budget() - used : 0;
  int64_t width = std::min<int64_t>(N, int64_t(avail / std::max<uint64_t>(per_column, 1)));
  if (width < 1)
    throw std::runtime_error(std::string(what) + ": not even one column fits the device memory budget of " +
                             std::to_string(dev_->budget() >> 20) + " MiB (raise --device_memory)");
  if (width < N && width > 32) width -= width % 32;  // whole warps
  return width;
}

Panel CudaBackend::upload_panel(const WeightMatrix& w, int64_t n0, int64_t width) {
  const size_t esz = dtype_size(w.dtype);
  const int64_t K = w.K(), N = w.N();
  Panel p;
  p.n0 = n0;
  p.width = width;
  const int64_t rows = w.k_axis == 0 ? K : width, cols = w.k_axis == 0 ? width : K;
  const uint8_t* d = kept(w.buffer);
  if (d && (w.k_axis == 1 || width == N)) {  // contiguous in the kept copy: read in place
    p.view = WeightView{d + size_t(w.k_axis == 1 ? n0 * K : 0) * esz, int(w.dtype), rows, cols, w.k_axis};
    return p;
  }
  p.data = DeviceBuffer<uint8_t>(*dev_, size_t(K * width) * esz);
  if (d) {  // on the device already: a copy there, nothing crosses the bus
    if (w.k_axis == 0)
      dev_->on_device_2d(p.data.get(), size_t(width) * esz, d + size_t(n0) * esz, size_t(N) * esz,
                         size_t(width) * esz, size_t(K));
    else
      dev_->on_device_2d(p.data.get(), p.data.bytes(), d + size_t(n0 * K) * esz, p.data.bytes(), p.data.bytes(), 1);
  } else if (w.k_axis == 0) {  // [K, N]: `width` columns of every row
    const auto* src = static_cast<const uint8_t*>(w.data);
    dev_->to_device_2d(p.data.get(), size_t(width) * esz, src + size_t(n0) * esz, size_t(N) * esz, size_t(width) * esz,
                       size_t(K));
  } else {  // [N, K]: consecutive rows
    dev_->to_device(p.data.get(), static_cast<const uint8_t*>(w.data) + size_t(n0 * K) * esz, p.data.bytes());
  }
  p.view = WeightView{p.data.get(), int(w.dtype), rows, cols, w.k_axis};
  return p;
}

DeviceQuant CudaBackend::quant_buffers(const WeightView& v, const QuantSpec& spec) {
  const int64_t G = num_blocks(v.K(), spec.block), N = v.N();
  DeviceQuant q;
  q.codes = DeviceBuffer<uint8_t>(*dev_, size_t(v.rows * v.cols));
  q.scales = DeviceBuffer<float>(*dev_, size_t(G * N));
  if (spec.zero_point) q.zero_points = DeviceBuffer<uint8_t>(*dev_, size_t(G * N));
  q.error = DeviceBuffer<double>(*dev_, size_t(G * N));
  return q;
}

void CudaBackend::download_quant(const WeightMatrix& w, const Panel& p, const QuantSpec& spec, DeviceQuant& q,
                                 bool packed, HostQuant& h) {
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block), n0 = p.n0, wd = p.width;
  QuantResult& out = h.out;
  // Each column's error summed over its blocks on the device (g in order); none when the operation sums
  // its errors itself (gptq).
  if (q.error.size()) launch(*dev_, wd, ColumnSumBody{q.error.get(), G, wd, h.err_n.get() + n0});
  if (h.kept) {
    store_quant(w, p, spec, q, *h.kept);
    return;
  }
  if (packed) {
    const int64_t n = K * wd;
    q.packed = DeviceBuffer<uint8_t>(*dev_, size_t((n + 1) / 2));
    launch(*dev_, (n + 1) / 2, PackOnnxBody{q.codes.get(), n, q.packed.get()});
  }
  const bool narrow = !h.scales16.empty();
  if (narrow) {
    q.scales16 = DeviceBuffer<uint16_t>(*dev_, q.scales.size());
    launch(*dev_, int64_t(q.scales.size()),
           NarrowScalesBody{q.scales.get(), int(scale_type(spec, w.dtype)), q.scales16.get()});
  }
  const size_t ssz = narrow ? 2 : 4;
  uint8_t* scales_host = narrow ? reinterpret_cast<uint8_t*>(h.scales16.data()) : reinterpret_cast<uint8_t*>(out.scales.data());
  const void* scales_dev = narrow ? static_cast<const void*>(q.scales16.get()) : static_cast<const void*>(q.scales.get());
  dev_->synchronize();
  if (w.k_axis == 0) {  // codes [K, N], params [G, N]: strided rows
    if (packed)  // N and wd even: each row of the panel is wd / 2 whole bytes of the packed weight
      dev_->to_host_2d(out.packed.data() + n0 / 2, size_t(N / 2), q.packed.get(), size_t(wd / 2), size_t(wd / 2),
                       size_t(K));
    else
      dev_->to_host_2d(out.codes.data() + n0, size_t(N), q.codes.get(), size_t(wd), size_t(wd), size_t(K));
    dev_->to_host_2d(scales_host + size_t(n0) * ssz, size_t(N) * ssz, scales_dev, size_t(wd) * ssz, size_t(wd) * ssz,
                     size_t(G));
    if (spec.zero_point)
      dev_->to_host_2d(out.zero_points.data() + n0, size_t(N), q.zero_points.get(), size_t(wd), size_t(wd), size_t(G));
  } else {  // codes [N, K], params [N, G]: consecutive rows
    if (packed)  // the panel starts on a whole byte (n0 * K even)
      dev_->to_host(out.packed.data() + n0 * K / 2, q.packed.get(), q.packed.bytes());
    else
      dev_->to_host(out.codes.data() + n0 * K, q.codes.get(), q.codes.bytes());
    dev_->to_host(scales_host + size_t(n0 * G) * ssz, scales_dev, q.scales.size() * ssz);
    if (spec.zero_point) dev_->to_host(out.zero_points.data() + n0 * G, q.zero_points.get(), q.zero_points.bytes());
  }
}

uint64_t CudaBackend::result_bytes(const WeightMatrix& w, const QuantSpec& spec, bool keep) const {
  if (!keep) return 0;
  const int64_t n = w.rows * w.cols, GN = num_blocks(w.K(), spec.block) * w.N();
  const uint64_t bytes = uint64_t(n) + uint64_t(GN) * (4 + (spec.zero_point ? 1 : 0));
  // Half the budget at most with what is held (as upload()): the panels that compute it need the rest.
  if (dev_->in_use_live() + bytes + 16 * 1024 > dev_->budget() / 2) return 0;  // comes back as ever
  return bytes;
}

std::shared_ptr<DeviceResult> CudaBackend::result_buffers(const WeightMatrix& w, const QuantSpec& spec, bool keep) {
  if (!result_bytes(w, spec, keep)) return {};
  const int64_t n = w.rows * w.cols, GN = num_blocks(w.K(), spec.block) * w.N();
  auto r = std::make_shared<DeviceResult>();
  r->owner = this;
  r->codes = DeviceBuffer<uint8_t>(*dev_, size_t(n));
  r->scales = DeviceBuffer<float>(*dev_, size_t(GN));
  if (spec.zero_point) r->zero_points = DeviceBuffer<uint8_t>(*dev_, size_t(GN));
  r->scale_dtype = int(scale_type(spec, w.dtype));
  return r;
}

const DeviceResult* CudaBackend::kept_result(const QuantResult& q) const {
  const auto* r = dynamic_cast<const DeviceResult*>(q.kept.buffer.get());
  return r && r->owner == this ? r : nullptr;
}

Tensor CudaBackend::kept_tensor(const WeightMatrix& w, std::shared_ptr<DeviceResult> r) const {
  if (!r) return {};
  Tensor t{DType::kUInt8, {w.rows, w.cols}, nullptr, {}};
  t.buffer = std::move(r);
  return t;
}

void CudaBackend::store_quant(const WeightMatrix& w, const Panel& p, const QuantSpec& spec, const DeviceQuant& q,
                              DeviceResult& r) {
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block), n0 = p.n0, wd = p.width;
  if (w.k_axis == 0) {  // codes [K, N], params [G, N]: the panel's columns of every row
    dev_->on_device_2d(r.codes.get() + n0, size_t(N), q.codes.get(), size_t(wd), size_t(wd), size_t(K));
    dev_->on_device_2d(r.scales.get() + n0, size_t(N) * 4, q.scales.get(), size_t(wd) * 4, size_t(wd) * 4, size_t(G));
    if (spec.zero_point)
      dev_->on_device_2d(r.zero_points.get() + n0, size_t(N), q.zero_points.get(), size_t(wd), size_t(wd), size_t(G));
  } else {  // codes [N, K], params [N, G]: the panel's rows
    dev_->on_device_2d(r.codes.get() + n0 * K, q.codes.bytes(), q.codes.get(), q.codes.bytes(), q.codes.bytes(), 1);
    dev_->on_device_2d(r.scales.get() + n0 * G, q.scales.bytes(), q.scales.get(), q.scales.bytes(), q.scales.bytes(), 1);
    if (spec.zero_point)
      dev_->on_device_2d(r.zero_points.get() + n0 * G, q.zero_points.bytes(), q.zero_points.get(),
                         q.zero_points.bytes(), q.zero_points.bytes(), 1);
  }
}

// The host's copy of 4-bit codes from their packed form: low nibble first, symmetric codes sign-extended
// (a code byte is int8 then), as pack_onnx read them.
void unpack_codes(const std::vector<uint8_t>& packed, bool zero_point, std::vector<uint8_t>& codes) {
  const int64_t n = int64_t(codes.size()), chunk = int64_t(1) << 20;
  parallel_for((n + chunk - 1) / chunk, [&](int64_t c) {
    const int64_t i1 = std::min(n, (c + 1) * chunk);
    for (int64_t i = c * chunk; i < i1; ++i) {
      const uint8_t v = uint8_t((packed[size_t(i / 2)] >> (4 * (i & 1))) & 0x0f);
      codes[size_t(i)] = zero_point || v < 8 ? v : uint8_t(v | 0xf0);
    }
  });
}

template <class Run>
void CudaBackend::quantize_panels(const WeightMatrix& w, const QuantSpec& spec, uint64_t fixed, QuantResult& out,
                                  const Run& run, uint64_t scratch_per_column, int64_t column_quantum,
                                  bool pack_only) {
  check(spec);
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  out.groups = G;
  // Kept on the device for the packings (allocated first: the panels fit beside it), else brought back.
  std::shared_ptr<DeviceResult> kept = result_buffers(w, spec, out.keep);
  out.scales.assign(kept ? 0 : size_t(G * N), 0.0f);
  out.zero_points.assign(spec.zero_point && !kept ? size_t(G * N) : 0, 0);
  // Scales of a 16-bit type come back in it (exact: they are rounded to it already).
  const int st = int(scale_type(spec, w.dtype));
  HostQuant h{out, std::vector<uint16_t>(!kept && (st == hd::kF16 || st == hd::kBF16) ? size_t(G * N) : 0),
              DeviceBuffer<double>(*dev_, size_t(N)), kept.get()};
  const uint64_t per_col =
      uint64_t(K) * (dtype_size(w.dtype) + 1) + uint64_t(K + 1) / 2 + uint64_t(G) * (4 + 2 + 1 + 8) + 8 + scratch_per_column;
  int64_t width = panel_width(fixed, per_col, N, "quantize");
  // Panels start on whole bytes of packed codes (a quantum of 2), or on an operation's column tiles.
  if (width < N && width > column_quantum) width -= width % column_quantum;
  // 4-bit codes come back packed (half the bytes) when every panel is whole bytes of the packed weight.
  const bool packed =
      !kept && spec.bits == 4 && (w.k_axis == 0 ? N % 2 == 0 : true) && (width % 2 == 0 || width == N);
  out.packed.assign(packed ? size_t((w.rows * w.cols + 1) / 2) : 0, 0);
  pack_only = pack_only && spec.bits == 4 && !kept;
  out.codes.assign(kept || (packed && pack_only) ? 0 : size_t(w.rows * w.cols), 0);
  for (int64_t n0 = 0; n0 < N; n0 += width) {
    Panel p = upload_panel(w, n0, std::min(width, N - n0));
    DeviceQuant q = quant_buffers(p.view, spec);
    run(p, q);
    download_quant(w, p, spec, q, packed, h);
  }
  if (packed && !pack_only) unpack_codes(out.packed, spec.zero_point, out.codes);
  if (pack_only && !packed) {  // panels that were not whole bytes of the packing: packed here
    out.packed = pack_onnx(out.codes, 4);
    out.codes.clear();
  }
  for (size_t i = 0; i < h.scales16.size(); ++i)
    out.scales[i] = st == hd::kF16 ? hd::half_to_float(h.scales16[i]) : hd::bf16_to_float(h.scales16[i]);
  // Summed in one fixed order (columns in order, each over its blocks in order), whatever the panels were.
  DeviceBuffer<double> total(*dev_, 1);
  launch(*dev_, 1, RowSumBody{h.err_n.get(), N, total.get()});
  out.sq_error = download(total)[0];
  out.kept = kept_tensor(w, std::move(kept));
}

void CudaBackend::rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) {
  const OpScope op(*dev_, "rtn");
  dev_->count_flops(8.0 * double(w.rows * w.cols));  // range, quotient, rounding, error
  quantize_panels(
      w, spec, 0, out, [&](Panel& p, DeviceQuant& q) { launch_rtn(*dev_, p.view, rtn_shape_of(spec, w.dtype), q.out()); },
      0, 2, out.pack);
}

void CudaBackend::rtn_lsq(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt,
                          QuantResult& out) {
  const OpScope op(*dev_, "rtn_lsq");
  // Per element: symmetric, 2(2·steps + 1) candidates of a fit and a ranking (~12 flops) and up to ten
  // scored scales (~8); zero point, 2·steps + 3 fits (~8) and two scored ones.
  const double el = double(w.rows * w.cols), st = opt.steps;
  dev_->count_flops(el * (spec.zero_point ? (2 * st + 3) * 8 + 16 : 2 * (2 * st + 1) * 12 + 80));
  quantize_panels(w, spec, 0, out, [&](Panel& p, DeviceQuant& q) {
    launch(*dev_, int64_t(q.scales.size()),
           RtnLsqBody{p.view, shape_of(spec, w.dtype), q.out(), int(opt.weight), opt.steps});
  });
}

void CudaBackend::hqq(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) {
  const OpScope op(*dev_, "hqq");
  if (!spec.zero_point) throw std::invalid_argument("hqq: needs zero points (spec.zero_point)");
  // Per element and iteration: ~20 float flops. Per block and iteration: two powers in double (hd_pow.h,
  // ~60 operations each) for the threshold below which the shrinkage needs none (hqq_fit.h); the
  // elements above it (SmolLM2: 1 in 90 000) are not counted. All iterations are counted (a block may
  // stop sooner).
  const double it = double(opt.iters), el = double(w.rows * w.cols);
  dev_->count_flops(20.0 * it * el, 120.0 * it * double(num_blocks(w.K(), spec.block) * w.N()));
  const BlockShape shape = shape_of(spec, w.dtype);
  if (!opt.float_zero_point) {
    quantize_panels(w, spec, 0, out, [&](Panel& p, DeviceQuant& q) {
      launch(*dev_, int64_t(q.scales.size()), HqqBody{p.view, shape, q.out(), opt});
    });
    return;
  }
  // Fractional zero points: one more array per panel, laid out as the scales and rounded to the scale
  // type, so that a 16-bit type's come back in it (exact), as the scales do.
  const int64_t G = num_blocks(w.K(), spec.block), N = w.N();
  const int st = shape.scale_dtype;
  const bool narrow = st == hd::kF16 || st == hd::kBF16;
  out.float_zero_points.assign(narrow ? 0 : size_t(G * N), 0.0f);
  std::vector<uint16_t> z16_host(narrow ? size_t(G * N) : 0);
  const size_t zsz = narrow ? 2 : 4;
  quantize_panels(
      w, spec, 0, out,
      [&](Panel& p, DeviceQuant& q) {
        DeviceBuffer<float> z(*dev_, q.scales.size());
        launch(*dev_, int64_t(q.scales.size()), HqqFloatZeroBody{p.view, shape, q.out(), z.get(), opt});
        DeviceBuffer<uint16_t> z16;
        if (narrow) {
          z16 = DeviceBuffer<uint16_t>(*dev_, q.scales.size());
          launch(*dev_, int64_t(q.scales.size()), NarrowScalesBody{z.get(), st, z16.get()});
        }
        const void* src = narrow ? static_cast<const void*>(z16.get()) : static_cast<const void*>(z.get());
        auto* dst = narrow ? reinterpret_cast<uint8_t*>(z16_host.data())
                           : reinterpret_cast<uint8_t*>(out.float_zero_points.data());
        const size_t row = size_t(p.width) * zsz;
        dev_->synchronize();
        if (w.k_axis == 0)  // [G, N]: the panel's columns of every row
          dev_->to_host_2d(dst + size_t(p.n0) * zsz, size_t(N) * zsz, src, row, row, size_t(G));
        else  // [N, G]: the panel's rows
          dev_->to_host(dst + size_t(p.n0 * G) * zsz, src, size_t(p.width * G) * zsz);
      },
      uint64_t(G) * (4 + 2));
  if (narrow) {
    out.float_zero_points.resize(z16_host.size());
    for (size_t i = 0; i < z16_host.size(); ++i)
      out.float_zero_points[i] = st == hd::kF16 ? hd::half_to_float(z16_host[i]) : hd::bf16_to_float(z16_host[i]);
  }
}

void CudaBackend::rtn_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* cw,
                               const std::vector<float>& ratios, QuantResult& out) {
  const OpScope op(*dev_, "rtn_weighted");
  dev_->count_flops(8.0 * double(w.rows * w.cols) * double(ratios.size() * (spec.zero_point ? 1 : 2) + 1));
  if (ratios.empty()) throw std::invalid_argument("rtn_quantize_weighted: no clip ratio to try");
  const DeviceBuffer<float> cw_d = upload(cw, size_t(w.K())), r_d = upload(ratios.data(), ratios.size());
  quantize_panels(w, spec, 0, out, [&](Panel& p, DeviceQuant& q) {
    launch(*dev_, int64_t(q.scales.size()),
           RtnWeightedBody{p.view, shape_of(spec, w.dtype), q.out(), cw_d.get(), r_d.get(), int64_t(ratios.size())});
  });
}

void CudaBackend::rtn_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out) {
  const OpScope op(*dev_, "rtn_ratios");
  dev_->count_flops(8.0 * double(w.rows * w.cols));
  check(spec);
  const int64_t G = num_blocks(w.K(), spec.block);
  QuantSpec sym = spec;
  sym.zero_point = false;
  quantize_panels(w, sym, 0, out, [&](Panel& p, DeviceQuant& q) {
    // This panel's ratios: rows n0 .. n0 + width of [N, G].
    const DeviceBuffer<float> r = upload(ratio_ng + p.n0 * G, size_t(p.width * G));
    launch(*dev_, int64_t(q.scales.size()), RtnRatiosBody{p.view, shape_of(sym, w.dtype), q.out(), r.get()});
    dev_->synchronize();
  });
}

void CudaBackend::clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const Tensor& gram_t,
                                     int64_t gram_block, const float* inv_s, const GramClipOptions& opt,
                                     QuantResult& out) {
  const OpScope op(*dev_, "clip_quantize_gram");
  check(spec);
  if (gram_block != 0 && gram_block != spec.block) throw std::invalid_argument("gram_block must be 0 or the block");
  const int64_t K = w.K(), B = spec.block, G = num_blocks(K, B);
  const std::vector<float> ratios = opt.ratios.empty() ? std::vector<float>{1.0f} : opt.ratios;
  const int64_t R = int64_t(ratios.size()), C = R * ((opt.both_signs && !spec.zero_point) ? 2 : 1);
  // Per candidate: the residual and its loss (~10 flops an element) and E = G_g D_g, 2·B a element.
  dev_->count_flops(double(C) * double(K * w.N()) * (10.0 + 2.0 * double(B)));
  // Only the diagonal blocks are read: [G, B, B] on the device, the last one zero-padded.
  DeviceBuffer<float> gb(*dev_, size_t(G * B * B));
  {
    const double* gram = gram_t.f64();
    const auto* on_device = reinterpret_cast<const double*>(kept(gram_t.buffer));
    const double* kept_src = gram_block ? on_device : nullptr;
    if (!on_device && !gram) throw std::invalid_argument("clip_quantize_gram: a Gram matrix held by another backend");
    // Uploaded once for the activation's sibling weights (its blocks), else uploaded for this weight; a whole
    // G on the device (the layer engine's) gives its blocks there.
    DeviceBuffer<double> src(*dev_, kept_src ? 0 : size_t(G * B * B));
    if (!kept_src && gram_block) {
      upload_f64(src.get(), gram, src.size());  // float32 on the bus where that is exact
    } else if (!kept_src) {
      dev_->fill_zero(src.get(), src.bytes());
      for (int64_t g = 0; g < G; ++g) {
        const int64_t k0 = g * B, kn = std::min(K, k0 + B) - k0;
        if (on_device)
          dev_->on_device_2d(src.get() + g * B * B, size_t(B) * 8, on_device + k0 * K + k0, size_t(K) * 8,
                             size_t(kn) * 8, size_t(kn));
        else
          dev_->to_device_2d(src.get() + g * B * B, size_t(B) * 8, gram + k0 * K + k0, size_t(K) * 8,
                             size_t(kn) * 8, size_t(kn));
      }
    }
    const DeviceBuffer<float> is = inv_s ? upload(inv_s, size_t(K)) : DeviceBuffer<float>();
    launch(*dev_, G * B * B, GramBlocksBody{kept_src ? kept_src : src.get(), inv_s ? is.get() : nullptr, B, K, gb.get()});
    dev_->synchronize();
  }
  const DeviceBuffer<float> r_d = upload(ratios.data(), ratios.size());
  // Per column: D and E ([G·B] floats each), the block range, the best loss and candidate.
  const uint64_t scratch = uint64_t(G) * (2 * uint64_t(B) * 4 + sizeof(BlockRange) + 8 + 4);
  quantize_panels(
      w, spec, 0, out,
      [&](Panel& p, DeviceQuant& q) {
        const int64_t wd = p.width, cells = G * wd;
        const BlockShape shape = shape_of(spec, w.dtype);
        DeviceBuffer<float> d(*dev_, size_t(G * B * wd)), e(*dev_, size_t(G * B * wd));
        DeviceBuffer<BlockRange> range(*dev_, size_t(cells));
        DeviceBuffer<double> best_loss(*dev_, size_t(cells));
        DeviceBuffer<int> best_ci(*dev_, size_t(cells));
        dev_->fill_zero(d.get(), d.bytes());  // the rows of a partial last block past K stay zero
        launch(*dev_, cells, ClipRangeBody{p.view, shape, range.get()});
        for (int64_t ci = 0; ci < C; ++ci) {
          launch(*dev_, K * wd, ClipResidualBody{p.view, shape, range.get(), r_d.get(), R, ci, d.get()});
          gram_clip_products(wd, K, B, gb.get(), d.get(), e.get());
          launch(*dev_, cells, ClipLossBody{K, wd, B, ci, d.get(), e.get(), best_loss.get(), best_ci.get()});
        }
        launch(*dev_, cells, ClipWriteBody{p.view, shape, q.out(), range.get(), r_d.get(), R, best_ci.get()});
      },
      scratch, kGramClipColumns);
}

void CudaBackend::gram_clip_products(int64_t wd, int64_t K, int64_t B, const float* gb, const float* d, float* e) {
  // E_g = G_g · D_g for every block g, column-major (D_g is the [wd, B] matrix D_gᵀ), in the CPU's
  // products: tiles of kGramClipColumns columns, the partial last block as its own kn x kn product.
  const int64_t full = K / B, kn = K - full * B;
  for (int64_t c0 = 0; c0 < wd; c0 += kGramClipColumns) {
    const int nc = int(std::min(kGramClipColumns, wd - c0));
    if (full > 0)
      la().sgemm_strided_batched(Op::kN, Op::kN, nc, int(B), int(B), 1.0f, d + c0, int(wd), B * wd, gb, int(B), B * B,
                                 0.0f, e + c0, int(wd), B * wd, int(full));
    if (kn > 0)
      la().sgemm(Op::kN, Op::kN, nc, int(kn), int(kn), 1.0f, d + full * B * wd + c0, int(wd), gb + full * B * B, int(B),
                 0.0f, e + full * B * wd + c0, int(wd));
  }
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

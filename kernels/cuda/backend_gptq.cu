// The CUDA backend's GPTQ, the CPU fast kernel's algorithm (kernels/cpu/gptq_fast.cc) on the device:
//  - gptq_factor: the float64 Gram matrix goes up once (in row panels, scattered into H in sweep order
//    with its scaling, dead channels and dampening; the layer engine's, already on the device, is scattered
//    from there and only its diagonal comes back), dpotrf → dpotri → dpotrf through LinAlg, and U
//    stays on the device with the sweep's channel vectors (GptqFactor::upper's buffer), for every weight
//    reading that activation. The O(K) bookkeeping (order, energies, dampening) is the host's, shared
//    with the CPU (kernels/gptq_channels.h).
//  - gptq_quantize: per column panel (whole 128-column chunks, the CPU's), the working weight in sweep
//    order as float32 [K, width]; per lazy batch one thread per column sweeps the batch's channels, the
//    later rows get W[b1:] -= U[b0:b1, b1:]ᵀ · Err as one sgemm per chunk (a strided batch), and the
//    squared error is summed per chunk in the CPU's order. Codes (packed), scales, zero points and the
//    error sum come back.
// On the emulated device the LAPACK and BLAS calls are the CPU's on the same values, in the same order,
// so the results are the CPU backend's bits.
#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/gptq_kernels.h"
#include "kernels/cuda/launch.h"
#include "kernels/gptq_channels.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

constexpr int64_t kChunk = 128;                          // gptq_fast.cc's columns per chunk
constexpr uint64_t kStageBytes = uint64_t(4) << 20;      // a row panel of the Gram matrix on its way up
constexpr uint64_t kSlack = 64 * 1024;                   // allocation rounding and solver workspaces

// Where each array of a factor lies in its device buffer (int64 first, for their alignment).
// - kUploaded: a host factor's U [K, K] float32 after the channel vectors.
// - kMadeHere: gptq_factor's own buffer: H [K, K] float64 first, where the solver works and where U is
//   narrowed to float32 in place (upper_in_place), the vectors after it. One K² · 8 bytes at the peak,
//   not H beside U (1.5x that): a K = 11008 factor fits a 1 GiB device.
enum class Placement { kUploaded, kMadeHere };
struct FactorLayout {
  size_t perm, pos, upper, energy, dead, bytes;
  FactorLayout(int64_t K, Placement where) {
    const size_t head = where == Placement::kMadeHere ? size_t(K * K) * 8 : 0;
    perm = head, pos = perm + size_t(K) * 8;
    upper = where == Placement::kMadeHere ? 0 : pos + size_t(K) * 8;
    energy = (where == Placement::kMadeHere ? pos + size_t(K) * 8 : upper + size_t(K * K) * 4);
    dead = energy + size_t(K) * 4, bytes = dead + size_t(K);
  }
};

void check_spec(const QuantSpec& spec) {
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
}

// U = the upper triangle of a (float64 [K, K], row i of U = column i of L2), narrowed to float32 over a's
// own first half: element p (a float at byte 4p) is written after the double at byte 8p is read, in
// ranges [c, 2c) of doubling c, one launch each: a range reads bytes [8c, 16c) and writes [4c, 8c), which
// the ranges before it have read.
void upper_in_place_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& range) {
  if (n > 0) range(0, 1);
  for (int64_t c = 1; c < n; c *= 2) range(c, std::min(2 * c, n));
}

int64_t stage_rows(int64_t K) {
  return K > 0 ? std::clamp<int64_t>(int64_t(kStageBytes / (uint64_t(K) * 8)), 1, K) : 1;
}

}  // namespace

// A factor's arrays on the device: its own (kept by gptq_factor) or uploaded from a host factor.
struct CudaBackend::GptqArrays {
  DeviceBuffer<uint8_t> owned;
  const float* upper = nullptr;
  GptqChannels ch{};
};

CudaBackend::GptqArrays CudaBackend::gptq_arrays(const GptqFactor& f) {
  const int64_t K = f.K;
  const uint8_t* base = kept(f.upper.buffer);
  const FactorLayout L(K, base ? Placement::kMadeHere : Placement::kUploaded);
  GptqArrays a;
  if (!base) {  // a host factor (a host fallback's): U and the vectors go up once for this weight
    if (!f.upper.data || f.upper.elements() != K * K) throw std::invalid_argument("gptq_quantize: a factor without U");
    const std::vector<int64_t> pos = gptq_positions(f);
    a.owned = DeviceBuffer<uint8_t>(*dev_, L.bytes);
    uint8_t* d = a.owned.get();
    dev_->to_device(d + L.perm, f.perm.data(), size_t(K) * 8);
    dev_->to_device(d + L.pos, pos.data(), size_t(K) * 8);
    dev_->to_device(d + L.upper, f.upper.data, size_t(K * K) * 4);
    dev_->to_device(d + L.energy, f.energy.data(), size_t(K) * 4);
    dev_->to_device(d + L.dead, f.dead.data(), size_t(K));
    base = d;
  }
  a.upper = reinterpret_cast<const float*>(base + L.upper);
  a.ch.perm = reinterpret_cast<const int64_t*>(base + L.perm);
  a.ch.pos = reinterpret_cast<const int64_t*>(base + L.pos);
  a.ch.energy = reinterpret_cast<const float*>(base + L.energy);
  a.ch.dead = base + L.dead;
  return a;
}

void CudaBackend::gptq_hessian(const double* gram, int64_t K, bool on_device, const GptqArrays& arr,
                               const float* inv_s, double damp, double* h) {
  if (on_device) {  // the layer engine's XᵀX, on the device: scattered into H in place
    launch(*dev_, K * K, GptqHessianBody{gram, 0, K, arr.ch.pos, arr.ch.dead, inv_s, damp, h});
    dev_->synchronize();
    return;
  }
  const int64_t rows = stage_rows(K);
  DeviceBuffer<double> stage(*dev_, size_t(rows * K));
  for (int64_t r0 = 0; r0 < K; r0 += rows) {
    const int64_t nr = std::min(rows, K - r0);
    dev_->synchronize();  // the previous panel's scatter has read the staging buffer
    dev_->to_device(stage.get(), gram + r0 * K, size_t(nr * K) * 8);
    launch(*dev_, nr * K, GptqHessianBody{stage.get(), r0, K, arr.ch.pos, arr.ch.dead, inv_s, damp, h});
  }
  dev_->synchronize();
}

GptqFactor CudaBackend::gptq_factor(const Tensor& gram_t, const float* inv_s, double percdamp, bool act_order) {
  if (gram_t.dtype != DType::kFloat64 || gram_t.shape.size() != 2 || gram_t.shape[0] != gram_t.shape[1])
    throw std::invalid_argument("gptq_factor: a float64 K x K matrix");
  const int64_t K = gram_t.shape[0];
  const auto* on_device = reinterpret_cast<const double*>(kept(gram_t.buffer));
  if (!on_device && !gram_t.data) throw std::invalid_argument("gptq_factor: a Gram matrix held by another backend");
  const double* gram = on_device ? on_device : gram_t.f64();
  const FactorLayout L(K, Placement::kMadeHere);
  const uint64_t need = L.bytes + (on_device ? 0 : uint64_t(stage_rows(K) * K) * 8) + uint64_t(K) * 4 + kSlack;
  if (dev_->in_use_live() + need > dev_->budget()) {
    // H (float64) does not fit the budget: the CPU factors it (a on_device G comes back for it), and
    // gptq_quantize uploads that U for each weight it sweeps.
    std::vector<uint8_t> hbuf = on_device ? download(gram_t) : std::vector<uint8_t>();
    const Tensor gh = on_device ? host_view(DType::kFloat64, {K, K}, hbuf.data()) : gram_t;
    return on_host("gptq_factor", [&](Backend& h) {
      dev_->count_flops(0, double(K) * double(K) * double(K));
      return h.gptq_factor(gh, inv_s, percdamp, act_order);
    });
  }
  const OpScope op(*dev_, "gptq_factor");
  dev_->count_flops(0, double(K) * double(K) * double(K));  // Cholesky, inverse, Cholesky: ~K³ in fp64
  GptqFactor f;
  std::vector<double> g_diag;  // a on_device G's diagonal: K values come back for the host's bookkeeping
  if (on_device) {
    g_diag.resize(size_t(K));
    dev_->synchronize();
    dev_->to_host_2d(g_diag.data(), 8, on_device, size_t(K + 1) * 8, 8, size_t(K));
  }
  const std::vector<double> diag = on_device ? gptq_channels(g_diag.data(), K, inv_s, act_order, f, 1)
                                            : gptq_channels(gram, K, inv_s, act_order, f);
  const std::vector<int64_t> pos = gptq_positions(f);
  auto kept_f = std::make_shared<DeviceArray>();
  kept_f->owner = this;
  kept_f->data = DeviceBuffer<uint8_t>(*dev_, L.bytes);
  uint8_t* d = kept_f->data.get();
  dev_->to_device(d + L.perm, f.perm.data(), size_t(K) * 8);
  dev_->to_device(d + L.pos, pos.data(), size_t(K) * 8);
  dev_->to_device(d + L.energy, f.energy.data(), size_t(K) * 4);
  dev_->to_device(d + L.dead, f.dead.data(), size_t(K));
  kept_f->offset = L.upper;  // the tensor is U, among the sweep's vectors
  f.upper = Tensor{DType::kFloat32, {K, K}, nullptr, kept_f};
  const GptqArrays arr = gptq_arrays(f);
  const DeviceBuffer<float> is = inv_s ? upload(inv_s, size_t(K)) : DeviceBuffer<float>();
  double* a = reinterpret_cast<double*>(d);  // H, then H⁻¹'s factor, then (narrowed) U
  const int n = int(K);
  for (int attempt = 0; attempt < 5; ++attempt) {
    f.damp = gptq_damp_of(diag, percdamp, attempt);
    // A retry (H not positive definite even so: rare) builds H again from the host's Gram matrix rather
    // than holding a second K² copy on the device for it.
    gptq_hessian(gram, K, on_device != nullptr, arr, inv_s ? is.get() : nullptr, f.damp, a);
    // H is symmetric, so row- and column-major read the same; LAPACK's lower triangle throughout.
    if (la().dpotrf(Fill::kLower, n, a, n) != 0) continue;
    if (la().dpotri(Fill::kLower, n, a, n) != 0) continue;  // H⁻¹, lower triangle
    launch(*dev_, K * K, MirrorLowerBody{a, K});
    if (la().dpotrf(Fill::kLower, n, a, n) != 0) continue;  // H⁻¹ = L2 L2ᵀ = UᵀU, U = L2ᵀ
    upper_in_place(a, K);
    dev_->synchronize();
    return f;
  }
  throw std::runtime_error("GPTQ: the Gram matrix (K = " + std::to_string(K) +
                           ") is not positive definite even with 10^4 times the dampening");
}

void CudaBackend::upper_in_place(double* a, int64_t K) {
  upper_in_place_ranges(K * K, [&](int64_t first, int64_t end) {
    launch(*dev_, end - first, UpperFloatInPlaceBody{a, K, first});
  });
}

// What one gptq_quantize call sweeps with: the factor's arrays, the blocks fixed at each sweep position,
// the candidate ratios, and the shape of the work.
struct CudaBackend::GptqSweep {
  GptqArrays arr;
  DeviceBuffer<int32_t> fix;
  DeviceBuffer<float> ratios;
  BlockShape shape{};
  int64_t K = 0, B = 0, R = 0, C = 0;
  bool mid_batch_fix = false;  // a block is fixed after its batch's start: its values need p.vals
};

void CudaBackend::gptq_panel(const GptqSweep& sw, const WeightMatrix& w, const Panel& pnl, DeviceQuant& q,
                             double* chunk_error) {
  const int64_t K = sw.K, B = sw.B, wd = pnl.width, n0 = pnl.n0;
  WeightView src = pnl.view;
  if (const uint8_t* d = kept(w.buffer)) {  // read in place: the panel's columns of the kept weight
    const size_t esz = dtype_size(w.dtype);
    src = w.k_axis == 0 ? WeightView{d + size_t(n0) * esz, int(w.dtype), K, w.N(), 0}
                        : WeightView{d + size_t(n0 * K) * esz, int(w.dtype), wd, K, 1};
  }
  const WeightView dst{nullptr, int(w.dtype), w.k_axis == 0 ? K : wd, w.k_axis == 0 ? wd : K, w.k_axis};
  DeviceBuffer<float> wc(*dev_, size_t(K * wd)), err(*dev_, size_t(B * wd));
  DeviceBuffer<double> sq(*dev_, size_t(B * wd));
  DeviceBuffer<float> vals = sw.mid_batch_fix ? DeviceBuffer<float>(*dev_, size_t(std::min(sw.shape.block, K) * wd))
                                              : DeviceBuffer<float>();
  const GptqPanel p{src, dst, wc.get(), err.get(), sq.get(), vals.get(), wd};
  GptqChannels ch = sw.arr.ch;
  ch.fix = sw.fix.get();
  const QuantOut o{q.codes.get(), q.scales.get(), q.zero_points.get(), nullptr};
  const float* U = sw.arr.upper;
  const int64_t chunks = (wd + kChunk - 1) / kChunk, full = wd / kChunk, rest = wd % kChunk;
  launch(*dev_, K * wd, GptqLoadBody{src, ch.perm, ch.dead, wd, wc.get()});
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    const int64_t b1 = std::min(K, b0 + B);
    launch(*dev_, wd, GptqBatchBody{p, ch, U, K, sw.shape, o, sw.ratios.get(), sw.R, sw.C, b0, b1});
    launch(*dev_, chunks, GptqChunkErrorBody{sq.get(), b1 - b0, wd, kChunk, chunk_error});
    if (b1 == K) break;
    // W[b1:] -= U[b0:b1, b1:]ᵀ · Err per chunk, column-major as the CPU's row-major sgemm reads it.
    const int m = int(K - b1), kk = int(b1 - b0);
    const float* ub = U + b0 * K + b1;
    float* c = wc.get() + b1 * wd;
    if (full)
      la().sgemm_strided_batched(Op::kN, Op::kT, int(kChunk), m, kk, -1.0f, err.get(), int(wd), kChunk, ub, int(K), 0,
                                 1.0f, c, int(wd), kChunk, int(full));
    if (rest)
      la().sgemm(Op::kN, Op::kT, int(rest), m, kk, -1.0f, err.get() + full * kChunk, int(wd), ub, int(K), 1.0f,
                 c + full * kChunk, int(wd));
  }
}

// Columns per panel: all, or whole chunks that fit beside `fixed` bytes (0: not even one chunk fits).
int64_t CudaBackend::gptq_width(const WeightMatrix& w, const QuantSpec& spec, const GptqSweep& sw,
                                uint64_t fixed) const {
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  const uint64_t per_col = uint64_t(K) * (4 + 1) + uint64_t(K + 1) / 2 + uint64_t(G) * (4 + 2 + 1) +
                           uint64_t(sw.B) * 12 + (kept(w.buffer) ? 0 : uint64_t(K) * dtype_size(w.dtype)) +
                           (sw.mid_batch_fix ? uint64_t(std::min(spec.block, K)) * 4 : 0);
  const uint64_t used = dev_->in_use_live() + fixed + kSlack;
  const int64_t fit = dev_->budget() > used ? int64_t((dev_->budget() - used) / per_col) : 0;
  if (fit >= N) return N;
  return fit / kChunk * kChunk;
}

void CudaBackend::gptq_quantize(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f,
                                const GptqOptions& opt, QuantResult& out) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  if (f.K != K) throw std::invalid_argument("gptq_quantize: factor of K = " + std::to_string(f.K));
  if (!w.data && !kept(w.buffer)) throw std::invalid_argument("gptq_quantize: a weight with no data here");
  GptqSweep sw;
  sw.K = K;
  sw.B = std::max<int64_t>(1, opt.lazy_block);
  sw.R = int64_t(opt.ratios.size());
  sw.C = sw.R * ((spec.zero_point || !opt.both_signs) ? 1 : 2);
  const DType st = scale_type(spec, w.dtype);
  sw.shape = BlockShape{spec.bits, spec.block, spec.zero_point, int(st)};
  std::vector<int32_t> fix(static_cast<size_t>(K), -1);
  std::vector<uint8_t> seen(static_cast<size_t>(G), 0);
  for (int64_t i = 0; i < K; ++i) {
    const int64_t g = f.perm[size_t(i)] / spec.block;
    if (seen[size_t(g)]) continue;
    seen[size_t(g)] = 1;
    fix[size_t(i)] = int32_t(g);
    sw.mid_batch_fix = sw.mid_batch_fix || i % sw.B != 0;
  }
  const uint64_t fixed = (kept(f.upper.buffer) ? 0 : FactorLayout(K, Placement::kUploaded).bytes) + uint64_t(K) * 4 +
                         uint64_t(sw.R) * 4 + uint64_t(num_blocks(N, kChunk) + 1) * 8;
  // MatMulNBits: the result stays on the device for the packings (allocated first, the panels beside it)
  // where one chunk of the sweep still fits beside it; else it comes back as ever.
  bool keep = out.keep;
  int64_t width = gptq_width(w, spec, sw, fixed + result_bytes(w, spec, keep));
  if (width == 0 && result_bytes(w, spec, keep)) {
    keep = false;
    width = gptq_width(w, spec, sw, fixed);
  }
  if (width == 0)
    // Not even one chunk of columns fits beside U: the CPU sweeps it (U comes back if only the device has it).
    return on_host("gptq_quantize", [&](Backend& h) {
      dev_->count_flops(double(K) * double(K) * double(N));
      std::vector<uint8_t> b;
      return h.gptq_quantize(host_weight(w, b), spec, gptq_host_factor(f), opt, out);
    });
  const OpScope op(*dev_, "gptq_quantize");
  dev_->count_flops(double(K) * double(K) * double(N));  // the updates: K² N over the triangle
  std::shared_ptr<DeviceResult> kept_result = result_buffers(w, spec, keep);
  sw.arr = gptq_arrays(f);
  sw.fix = upload(fix.data(), fix.size());
  sw.ratios = upload(opt.ratios.data(), opt.ratios.size());
  gptq_panels(w, spec, sw, width, kept_result, out);
}

void CudaBackend::gptq_panels(const WeightMatrix& w, const QuantSpec& spec, const GptqSweep& sw, int64_t width,
                              std::shared_ptr<DeviceResult> kept_result, QuantResult& out) {
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  out.groups = G;
  const bool back = !kept_result;  // else the panels' results go into the kept one, on the device
  out.codes.assign(back ? size_t(w.rows * w.cols) : 0, 0);
  out.scales.assign(back ? size_t(G * N) : 0, 0.0f);
  out.zero_points.assign(spec.zero_point && back ? size_t(G * N) : 0, 0);
  // 16-bit scales come back in their type; 4-bit codes packed (panels of whole chunks are whole bytes).
  const int st = sw.shape.scale_dtype;
  HostQuant h{out, std::vector<uint16_t>(back && (st == hd::kF16 || st == hd::kBF16) ? size_t(G * N) : 0), {},
              kept_result.get()};
  const bool packed = back && spec.bits == 4 && (w.k_axis == 1 || N % 2 == 0);
  out.packed.assign(packed ? size_t((w.rows * w.cols + 1) / 2) : 0, 0);
  const int64_t chunks = num_blocks(N, kChunk);
  DeviceBuffer<double> chunk_error(*dev_, size_t(chunks));
  dev_->fill_zero(chunk_error.get(), chunk_error.bytes());
  for (int64_t n0 = 0; n0 < N; n0 += width) {
    const int64_t wd = std::min(width, N - n0);
    Panel pnl;
    if (kept(w.buffer)) {
      pnl.n0 = n0;
      pnl.width = wd;
    } else {
      pnl = upload_panel(w, n0, wd);
    }
    DeviceQuant q;
    q.codes = DeviceBuffer<uint8_t>(*dev_, size_t(K * wd));
    q.scales = DeviceBuffer<float>(*dev_, size_t(G * wd));
    if (spec.zero_point) q.zero_points = DeviceBuffer<uint8_t>(*dev_, size_t(G * wd));
    gptq_panel(sw, w, pnl, q, chunk_error.get() + n0 / kChunk);
    download_quant(w, pnl, spec, q, packed, h);  // no q.error: the chunks' errors are summed below
  }
  if (packed) unpack_codes(out.packed, spec.zero_point, out.codes);
  for (size_t i = 0; i < h.scales16.size(); ++i)
    out.scales[i] = st == hd::kF16 ? hd::half_to_float(h.scales16[i]) : hd::bf16_to_float(h.scales16[i]);
  DeviceBuffer<double> total(*dev_, 1);  // the chunks' sums in order, as the CPU adds them
  launch(*dev_, 1, RowSumBody{chunk_error.get(), chunks, total.get()});
  out.sq_error = download(total)[0];
  out.kept = kept_tensor(w, std::move(kept_result));
}

GptqFactor CudaBackend::gptq_host_factor(const GptqFactor& f) {
  GptqFactor h = f;
  if (const uint8_t* d = kept(f.upper.buffer)) {  // counted under the operation that needs it on the host
    std::vector<float> u(size_t(f.K * f.K));
    dev_->synchronize();
    dev_->to_host(u.data(), d + mine(f.upper.buffer)->offset, u.size() * 4);
    h.upper = host_tensor(DType::kFloat32, {f.K, f.K}, std::move(u));
  }
  return h;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

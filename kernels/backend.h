// The kernels interface: every array operation the quantization pipeline runs, one Backend per
// device. Arrays in, arrays out: the interface knows no graph and no file. Each operation has a
// plain scalar reference in kernels/cpu (`*_ref`), which every backend is tested against
// (tests/unit/test_backend_ops.cc walks every operation on every backend).
//
// Layouts: a weight is a WeightMatrix in its stored layout ([K, N] or [N, K], see quant_types.h);
// per-channel vectors (scales s, energies) have K values; Gram matrices are K x K row-major.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

// What the AWQ loss reads of one activation: XᵀX (float32, K x K row-major) over `rows` tokens and,
// optionally, its Cholesky factor U (XᵀX = UᵀU, upper triangle row-major, gram_cholesky_upper):
// with U the loss is ‖U D‖², one triangular product instead of a GEMM.
struct GramForm {
  int64_t K = 0;
  int64_t rows = 0;
  const float* gram32 = nullptr;
  const float* upper = nullptr;  // null (and no upper_resident): the GEMM form Σ D ⊙ (G D)
  std::shared_ptr<const Resident> upper_resident{};  // U kept on the backend (gram_cholesky_kept)
  std::shared_ptr<const Resident> gram_resident{};   // gram32 kept on the backend (keep_gram)
  bool has_upper() const { return upper || upper_resident; }
};

// gram_cholesky_upper's factor where the backend keeps it: host values (the CPU), or the backend's own
// copy (a device backend; `host` stays empty). Neither: not factorisable.
struct GramFactor {
  std::vector<float> host;
  std::shared_ptr<const Resident> resident;
  // Not factorisable on a device: the float32 Gram the attempt uploaded, kept for the GEMM form (as
  // keep_gram would keep it), so that it does not cross the bus twice. Null otherwise.
  std::shared_ptr<const Resident> gram_resident;
  bool ok() const { return !host.empty() || resident; }
};

// The Gram-form clip search's losses are float products E = G_g·D over tiles of this many output
// columns (starting at multiples of it): part of the operation's definition, since BLAS sums a product
// in an order that depends on its shape. Every backend issues the same tiles, so their choices agree.
constexpr int64_t kGramClipColumns = 256;

// The AWQ loss's products run the same way, over column tiles from multiples of their width.
// The triangular form (‖U D‖²): each call repacks U, so tiles are wide (at 7B shapes ~1000 columns cost
// 7-16 % fewer CPU seconds than 256); an even number of them (two threads finish together); fixed by N
// alone, so a BLAS kernel set whose products depend on the call's width (OpenBLAS's Haswell set does,
// its SkylakeX set does not) still gives the same loss on every thread count and backend. N itself up to
// 1024. The Gram (GEMM) form, ModelOpt's mode: tiles of 256 columns.
inline int64_t triangular_loss_chunk(int64_t N) {
  if (N <= 1024) return N;
  const int64_t chunks = 2 * num_blocks(N, 2048);
  return num_blocks(num_blocks(N, chunks), 64) * 64;
}
constexpr int64_t kGramLossColumns = 256;

// The diagonal shifts (x the largest diagonal element) a Gram matrix's Cholesky factorisation tries, in
// order, on every backend. 0 first; 1e-12 and 1e-9 for a matrix that is only semi-definite in exact
// arithmetic (a channel always zero), which change no loss comparison; 1e-6 to 1e-4 for one of fewer
// token rows than channels accumulated in float32, whose rounding leaves eigenvalues of about -1e-7 of
// the largest (measured on 2048 tokens at K = 4096 and 11008: 1e-6 or 1e-5 was needed). The factor then
// measures D^T (G + shift I) D: the loss plus a ridge term far below it, where the GEMM form that a
// failed factorisation falls back to costs twice the products.
constexpr double kCholeskyShifts[] = {0.0, 1e-12, 1e-9, 1e-6, 1e-5, 1e-4};

// nibble's Gram-form clip search: candidate ratios, tried in this order (1.0 should come first).
struct GramClipOptions {
  std::vector<float> ratios;
  bool both_signs = true;  // symmetric: also try the negated scale (the extreme on code -2^(b-1))
  // The block-diagonal as keep_gram_blocks kept it on the backend (read there instead of `gram`), shared
  // by the sibling weights that read one activation.
  std::shared_ptr<const Resident> kept_blocks{};
};

// GPTQ's inverse-Hessian factor of one activation (gptq_factor): what every weight reading that
// activation sweeps with.
struct GptqFactor {
  int64_t K = 0;
  std::vector<int64_t> perm;   // sweep order: position i quantizes input channel perm[i]
  std::vector<float> upper;    // U with H⁻¹ = UᵀU, H the damped Gram in sweep order: K x K row-major, upper
  // U (and the sweep's channel vectors) kept on a device backend: `upper` is then empty, and that backend's
  // gptq_quantize of every weight reading the activation reads it in place.
  std::shared_ptr<const Resident> upper_resident{};
  std::vector<float> energy;   // diag of the (scaled, undamped) Gram per input channel, in channel order
  std::vector<uint8_t> dead;   // channels that are never active (zero diagonal): their weights become 0
  double damp = 0;             // what was added to the diagonal
};

// How gptq_quantize fixes each group's scale when the sweep first reaches one of its channels: the
// candidate clip ratios of the group's current (error-compensated) values, weighted by `energy`.
struct GptqOptions {
  std::vector<float> ratios{1.0f};
  bool both_signs = true;  // symmetric: also the negated scale (the extreme on code -2^(b-1))
  int64_t lazy_block = 128;  // channels per lazy batch of the fast kernel (no effect on the result's math)
};

// How rtn_lsq weighs each element's squared error when it fits and chooses a block's scale:
// uniformly, by x² (llama.cpp's make_qx_quants), or by rms(block) + |x| (its make_qkx2_quants use).
enum class FitWeight { kUniform, kSquare, kMagnitude };

struct RtnSearchOptions {
  FitWeight weight = FitWeight::kUniform;
  int steps = 9;  // candidates 2 * steps + 1 (symmetric) or 2 * steps + 3 (zero point), besides plain RTN
};

// Half-quadratic quantization's parameters (ONNX Runtime's and mobiusml's defaults).
struct HqqOptions {
  float lp_norm = 0.7f;
  float beta = 10.0f;
  float kappa = 1.01f;
  int iters = 20;
  bool refit_scale = false;  // least-squares scale on the final codes, kept where it lowers the error
  // Keep HQQ's fractional zero point (QuantResult::float_zero_points, rounded to the scale type) instead
  // of rounding it to an integer code: for MatMulNBits, whose zero points may be floats.
  bool float_zero_point = false;
};

// Device memory a backend may hold (its budget) and the most it held at once; zero for the CPU.
struct DeviceMemoryUse {
  uint64_t budget = 0;
  uint64_t peak = 0;
};

// What one operation of a device backend moved and launched (the transfer ledger): bytes copied host to
// device and back, device allocations that reached the device (not served by the pool), kernel and
// BLAS launches, and whether any of its work ran on the host instead of the device.
struct OpTransfers {
  uint64_t h2d_bytes = 0;
  uint64_t d2h_bytes = 0;
  uint64_t allocations = 0;
  uint64_t launches = 0;
  uint64_t calls = 0;
  // The arithmetic the operation implies, float32 and float64 (a model's count from the shapes, what a
  // roofline projection needs; not measured). Host fallbacks count what the device would have done.
  uint64_t flops = 0;
  uint64_t flops_fp64 = 0;
  bool host_fallback = false;
  // How the copies went (kernels/cuda/device.h): the bytes of h2d + d2h that went through the pinned
  // staging ring and the chunked copies (DMAs) they took; uploads enqueued ahead of their use
  // (Backend::keep's prefetch, counted under the operation that enqueued them) and, of those, the ones
  // during which launches were issued before anything waited for them (overlapped with compute).
  uint64_t staged_bytes = 0;
  uint64_t staging_chunks = 0;
  uint64_t prefetches = 0;
  uint64_t prefetch_bytes = 0;
  uint64_t prefetches_overlapped = 0;
  uint64_t prefetch_bytes_overlapped = 0;
};

// The ledger of a run: totals and one entry per operation name (the Backend method's name).
struct TransferLedger {
  OpTransfers total;
  std::map<std::string, OpTransfers> ops;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", "cuda" or "cuda_emulated" (the report's name for who ran a stage); describe(): one line
  // for the log.
  virtual std::string name() const = 0;
  virtual std::string describe() const = 0;
  virtual DeviceMemoryUse device_memory() const { return {}; }
  // The transfer ledger of a device backend; null for the CPU, where a tensor is host memory and
  // nothing moves.
  virtual const TransferLedger* transfer_ledger() const { return nullptr; }
  // Whether two host threads may call this backend at once (one quantizing the next weight while the
  // other packs the last): true for the CPU, whose operations keep no state between calls; a device's
  // streams, memory and ledger are its one caller's.
  virtual bool takes_concurrent_calls() const { return false; }

  // ---- Arrays kept on the backend (tensors that live on the backend: uploaded once, read in place)
  // The weight put on the backend: its operations given the returned matrix read the backend's copy. A
  // device backend enqueues its upload and returns at once (when it fits its memory; else the matrix
  // comes back as it was): the operations that read it wait for the upload, so the host may keep the
  // next weight while this one computes (w.data must stay valid while the returned handle lives). The
  // CPU returns w as it is.
  virtual WeightMatrix keep(const WeightMatrix& w) { return w; }
  // Room for weights held together (a whole-model search keeps each for the quantizer that follows): one
  // allocation for arrays of these sizes, into which keep_in() puts them, so that holding more weights
  // makes no more allocations. Null where nothing is kept (the CPU) or the room does not fit.
  virtual std::shared_ptr<Resident> reserve_kept(const std::vector<uint64_t>& bytes) {
    (void)bytes;
    return {};
  }
  // keep() into `room` (reserve_kept's): w as it was (no resident) when the room has no space left for it;
  // the space comes back to the room when the returned handle's last copy goes.
  virtual WeightMatrix keep_in(const WeightMatrix& w, const std::shared_ptr<Resident>& room) {
    (void)room;
    return keep(w);
  }
  // scale_weight_f32 left on the backend: a device backend returns a float32 matrix that only it holds
  // (data null); the CPU computes it into `host` and returns a matrix on it.
  virtual WeightMatrix scale_weight_f32_kept(const WeightMatrix& w, const float* s, std::vector<uint8_t>& host);
  // scale_weight (W ⊙ s rounded to w's dtype) left on the backend likewise.
  virtual WeightMatrix scale_weight_kept(const WeightMatrix& w, const float* s, std::vector<uint8_t>& host);
  // gram_cholesky_upper left on the backend (a device backend keeps U; the CPU returns it in `host`).
  virtual GramFactor gram_cholesky_kept(const double* gram, int64_t K) { return {gram_cholesky_upper(gram, K), {}, {}}; }
  // The float32 Gram matrix put on the backend for the GEMM form of awq_losses (no factor): every loss
  // given the returned form reads the backend's copy. The CPU (or a device it does not fit) returns g.
  virtual GramForm keep_gram(const GramForm& g) { return g; }
  // The Gram matrix's block-diagonal [ceil(K/B), B, B] (float64, as clip_quantize_gram reads it with
  // gram_block = B) kept on a device backend for the sibling weights of one activation (null: not kept).
  virtual std::shared_ptr<const Resident> keep_gram_blocks(const double* blocks, int64_t K, int64_t B) {
    (void)blocks, (void)K, (void)B;
    return {};
  }

  // ---- Round to nearest (rtn_ref.h)
  // Plain RTN of one weight, ModelOpt's formulas.
  virtual void rtn(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out) = 0;
  // RTN where each block picks among `ratios` x its scale the one with the smallest error weighted
  // per input channel by channel_weight[k].
  virtual void rtn_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* channel_weight,
                            const std::vector<float>& ratios, QuantResult& out) = 0;
  // Symmetric RTN with a given clip ratio per block (ratio_ng [N * G], index n * G + g).
  virtual void rtn_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out) = 0;

  // ---- Calibration-free per-block searches (search_ref.h); codes are RTN's with the chosen parameters
  // Each block's scale (and zero point) by least squares around 2^b-level RTN, kept where the block's
  // weighted error falls (block_fit.h).
  virtual void rtn_lsq(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out) = 0;
  // HQQ: each block's zero point by the half-quadratic proximal iterations; spec.zero_point must be set.
  // opt.float_zero_point: the zero points are floats (out.float_zero_points; see QuantResult).
  virtual void hqq(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out) = 0;

  // ---- Weight scaling (stored layout in and out)
  // W ⊙ s along K, each product rounded to w.dtype.
  virtual std::vector<uint8_t> scale_weight(const WeightMatrix& w, const float* s) = 0;
  // W ⊙ s along K in float32 whatever w.dtype is.
  virtual std::vector<uint8_t> scale_weight_f32(const WeightMatrix& w, const float* s) = 0;
  // W ⊘ d along N (a consumer's 1/s folded into this weight's columns): w / round(d[n]), rounded.
  virtual std::vector<uint8_t> divide_columns(const WeightMatrix& w, const float* d) = 0;

  // ---- AWQ statistics, scales and loss (awq_ref.h)
  // ModelOpt's get_weight_scale (strided groups) or nibble's contiguous-block version: K values.
  virtual std::vector<float> awq_weight_mean(const WeightMatrix& w, int64_t block, bool contiguous) = 0;
  // ModelOpt's per-subgraph weight statistic of siblings that share an input: their [K, N_i] side by
  // side ([K, sum N], row-major) viewed as [block, -1], each element normalised by the max of its
  // column of that view (+1e-6), averaged over sum N. K * sum N must be a multiple of block.
  virtual std::vector<float> awq_weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block) = 0;
  // s(alpha) = x_mean^alpha / w_mean^(1-alpha), clamped and normalised: K values.
  virtual std::vector<float> awq_scale(const std::vector<float>& x_mean, const std::vector<float>& w_mean,
                                       double alpha) = 0;
  // Element-wise mean of equal-length vectors in numpy's float32 order (ModelOpt's sibling mean).
  virtual std::vector<float> mean_of(const std::vector<const std::vector<float>*>& v) = 0;
  // U with XᵀX = UᵀU from a float64 Gram matrix (empty when not factorisable).
  virtual std::vector<float> gram_cholesky_upper(const double* gram, int64_t K) = 0;
  // Per input channel diag(XᵀX)[k] / s[k]² from a float64 Gram matrix (s null: 1).
  virtual std::vector<float> channel_energy(const double* gram, int64_t K, const float* s) = 0;
  // The output error of quantizing W ⊙ s (against X ⊘ s) per token and column, one value per scale
  // vector: mean (XW - (X ⊘ s) Ŵ)². With clip_ratios each block picks its ratio as rtn_weighted does
  // (weights diag(XᵀX)/s², W ⊙ s in fp32, scales rounded to w.dtype); without, W ⊙ s is rounded to
  // w.dtype and quantized by plain RTN. Also the sensitivity measure of mixed precision (s = 1).
  virtual std::vector<double> awq_losses(const WeightMatrix& w, const std::vector<const float*>& scales,
                                         const QuantSpec& spec, const GramForm& gram,
                                         const std::vector<float>* clip_ratios) = 0;

  // ---- Clip search (clip_ref.h)
  // ModelOpt's _clip_search on its token sample x [T, K] float32: the chosen ratio per block [N * G].
  virtual std::vector<float> clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x,
                                                  int64_t T, const std::vector<double>& ratios,
                                                  int64_t bsz_col) = 0;
  // nibble's clip search on the Gram matrix (whole K x K, gram_block = 0, or its block-diagonal
  // [G, B, B], gram_block = B), scaled by inv_s on both sides when given; quantizes into out.
  virtual void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const double* gram,
                                  int64_t gram_block, const float* inv_s, const GramClipOptions& opt,
                                  QuantResult& out) = 0;

  // ---- GPTQ (gptq_ref.h)
  // The factor of H = diag(inv_s) XᵀX diag(inv_s) (inv_s null: 1) from a float64 K x K Gram matrix:
  // dead channels get a unit diagonal, H += percdamp * mean(diag H) * I (10x more, up to 4 times, when
  // H is still not positive definite), act_order sweeps channels by decreasing diag(H). Throws
  // std::runtime_error when no dampening makes it factorisable.
  virtual GptqFactor gptq_factor(const double* gram, int64_t K, const float* inv_s, double percdamp,
                                 bool act_order) = 0;
  // GPTQ of one weight: channels quantized in f.perm order, each one's rounding error spread over the
  // channels not yet quantized through U; block g's scale (and zero point) is fixed when the sweep first
  // reaches one of its channels, from the block's values at that moment. sq_error: against w.
  virtual void gptq_quantize(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f,
                             const GptqOptions& opt, QuantResult& out) = 0;

  // ---- Packing (pack.h)
  // ONNX INT4/UINT4 raw_data (two codes a byte, low nibble first); 8 bits: unchanged.
  virtual std::vector<uint8_t> pack_onnx(const std::vector<uint8_t>& codes, int bits) = 0;
  // A result's codes packed as pack_onnx does: q.packed when the backend brought them back packed
  // (nothing to do), else pack_onnx(q.codes, bits).
  std::vector<uint8_t> pack_onnx_codes(const QuantResult& q, int bits);
  // com.microsoft.MatMulNBits inputs B, scales [N, G] and packed zero points.
  virtual std::vector<uint8_t> pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                                       const QuantResult& q, int64_t layout_block) = 0;
  virtual std::vector<float> matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q) = 0;
  virtual std::vector<uint8_t> pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                            const QuantResult& q) = 0;
  // The float weight s·(q − z) in the stored layout, as `out` (dequant_ref.h): what qdq stores when the
  // codes are not the rounding of the original weight.
  virtual std::vector<uint8_t> dequantize(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q,
                                          DType out) = 0;
};

// kCudaEmulated: the CUDA backend's own code with the host as the device (tests, CI, `selftest`);
// only ever chosen explicitly.
enum class Device { kAuto, kCpu, kCuda, kCudaEmulated };

struct BackendOptions {
  Device device = Device::kAuto;
  // CUDA: device memory the backend may hold at once (0: the device's free memory less a margin;
  // emulated: 1 GiB).
  uint64_t device_memory = 0;
};

// Picks the backend. `why` receives one line saying what was chosen and why (e.g. "device auto:
// no usable CUDA device (...); using CPU"). Throws std::runtime_error when an explicitly requested
// device cannot be used.
std::unique_ptr<Backend> make_backend(const BackendOptions& options, std::string* why);

// Whether this build has the CUDA backend compiled in (for a GPU; and emulated).
bool cuda_compiled();
bool cuda_emulated_compiled();

}  // namespace nibble::kernels

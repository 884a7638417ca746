// The kernels interface: every array operation the quantization pipeline runs, one Backend per
// device. Arrays in, arrays out: the interface knows no graph and no file. Each operation has a
// plain scalar reference in kernels/cpu (`*_ref`), which every backend is tested against
// (tests/unit/test_backend_ops.cc walks every operation on every backend).
//
// The operations are declared once, in backend_ops.inc (with their layouts and meanings); arrays that
// stay on a backend between operations are Tensors (tensor.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/forward_types.h"
#include "kernels/quant_types.h"
#include "kernels/tensor.h"

namespace nibble::kernels {

// What the AWQ loss reads of one activation: XᵀX (float32 [K, K] row-major) over `rows` tokens and,
// optionally, its Cholesky factor U (XᵀX = UᵀU, upper triangle row-major, gram_cholesky_upper): with U
// the loss is ‖U D‖², one triangular product instead of a GEMM. Each is a tensor: host data, the
// backend's copy (Backend::upload, or left there by gram_cholesky_upper or gram_to_f32), or both. `gram`
// is always given (its diagonal weighs the clip choices): host data, or a device's copy alone where the
// statistics were accumulated there (the CPU reads host data only).
struct GramForm {
  int64_t K = 0;
  int64_t rows = 0;
  Tensor gram;
  Tensor upper;  // empty: the GEMM form Σ D ⊙ (G D)
  bool has_upper() const { return !upper.empty(); }
};

// gram_cholesky_upper's result: U (float32 [K, K], upper triangle) where the backend computed it (host
// memory on the CPU, the device's on a device); empty when not factorisable. A device whose attempt
// failed leaves the float32 Gram it uploaded in `gram` (for the GEMM form, so that it does not cross the
// bus twice); empty otherwise.
struct GramFactor {
  Tensor upper;
  Tensor gram;
  bool ok() const { return !upper.empty(); }
};

// An activation's statistics as accumulate_statistics folds its batches in, held where the backend that
// accumulates them keeps them (host memory on the CPU; a device's buffer, or host memory where its budget
// cannot hold them): the counted rows, Σ|x| per channel (float64 [K]) and XᵀX in float64, whole as its
// upper triangle packed row after row ([K(K+1)/2], gram_block = 0; packed_row) or only its diagonal blocks
// ([G, B, B], gram_block = B, both triangles, zero where the last block is partial). Empty tensors until
// the first batch.
struct ActivationSums {
  int64_t K = 0, gram_block = 0, rows = 0;
  Tensor sum_abs, gram;
};

// accumulate_statistics' order, part of its definition (the float32 products' bits depend on their shapes):
// XᵀX in products of at most this many rows, each in column panels this wide starting at multiples of it
// (a panel's rows above its diagonal block by sgemm, the block by ssyrk); a panel depends on K alone, so the
// sums depend neither on the thread count nor on the backend's memory.
constexpr int64_t kStatisticsRowsPerProduct = 2048;
constexpr int64_t kStatisticsPanelColumns = 128;

// The offset of row i's first kept element (i, i) in a packed upper triangle of order K.
inline int64_t packed_row(int64_t i, int64_t K) { return i * (2 * K - i + 1) / 2; }
// The float64 values of an ActivationSums' XᵀX: the packed triangle, or the diagonal blocks.
inline int64_t statistics_gram_values(int64_t K, int64_t gram_block) {
  return gram_block ? num_blocks(K, gram_block) * gram_block * gram_block : packed_row(K, K);
}

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
};

// GPTQ's inverse-Hessian factor of one activation (gptq_factor): what every weight reading that
// activation sweeps with.
struct GptqFactor {
  int64_t K = 0;
  std::vector<int64_t> perm;   // sweep order: position i quantizes input channel perm[i]
  // U with H⁻¹ = UᵀU, H the damped Gram in sweep order: float32 [K, K] row-major, upper. Host memory on
  // the CPU; a device backend leaves it (with the sweep's channel vectors) in its own buffer, which its
  // gptq_quantize of every weight reading the activation reads in place.
  Tensor upper;
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

// learned_rounding's knobs (kernels/learned_rounding.h): AutoRound's sign steps on each weight's rounding
// offset, then greedy single-level sweeps, on the layer's output error through XᵀX.
struct LearnedRoundingOptions {
  int iters = 0;            // sign steps (0: the sweeps only; see host/algo/learned_rounding.h)
  double lr = 0.005;        // the first step's size in levels, falling linearly to 0
  int polish_sweeps = 4;    // greedy sweeps after the steps (each stops early once nothing moves)
  double percdamp = 0.01;   // H += percdamp · mean(diag H) · I, as GPTQ's dampening
};

// What learned_rounding did to one weight: the objective Σ_n e_n H e_nᵀ of the codes it was given and of
// its own (summed over rows in order), and how many codes it moved.
struct LearnedRoundingStats {
  double objective_given = 0;
  double objective_learned = 0;
  int64_t moved = 0;
};

// One weight's rounding learned on its whole decoder layer (layer_round_weight, layer_round_step; the
// element math in kernels/layer_rounding.h). Its layout and starting point: tensors of host data or this
// backend's uploads, put there once per layer and read at every step.
struct LayerRoundProblem {
  int64_t rows = 0, cols = 0;
  int k_axis = 0;
  int64_t block = 128;
  int bits = 4;
  bool zero_point = false;
  int scale_dtype = 1;  // kernels/hd_float.h's code of the scales' type (float32)
  Tensor w;             // W' = W ⊙ s (/ d), float32 in the stored layout
  Tensor scale0;        // the starting block scales, float32, laid out as QuantResult's
  Tensor zero_points;   // uint8, laid out as the scales (zero_point); else empty
  Tensor s;             // AWQ's s, float32 [K]; empty: none
  Tensor divisor;       // a consumer's divisor, float32 [N]; empty: none
  int64_t K() const { return k_axis == 0 ? rows : cols; }
  int64_t N() const { return k_axis == 0 ? cols : rows; }
  int64_t G() const { return (K() + block - 1) / block; }
};

// The parameters learned: offsets v (float32, laid out as the weight) and scale factors f (float32, as the
// scales), where an operation left them; after layer_round_step also the graph's weight they give (what
// layer_round_weight would return: made while the step has each block at hand).
struct LayerRoundParams {
  Tensor v, f;
  Tensor weight;  // empty: not made
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
  // (Backend::upload's prefetch, counted under the operation that enqueued them) and, of those, the ones
  // during which launches were issued before anything waited for them (overlapped with compute).
  uint64_t staged_bytes = 0;
  uint64_t staging_chunks = 0;
  uint64_t prefetches = 0;
  uint64_t prefetch_bytes = 0;
  uint64_t prefetches_overlapped = 0;
  uint64_t prefetch_bytes_overlapped = 0;
  // The most uploads through the staging ring enqueued and not yet waited for while the host filled the
  // next staging buffer: how deep the ring ran (a maximum over the calls, not a sum).
  uint64_t uploads_in_flight = 0;
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

  // Every operation, from the one table (backend_ops.inc, where each is described).
#define NIBBLE_BACKEND_OP(name, result, params) virtual result name params = 0;
#include "kernels/backend_ops.inc"
#undef NIBBLE_BACKEND_OP

  // A result's codes packed as pack_onnx does: q.packed when the backend brought them back packed
  // (nothing to do), else pack_onnx(q.codes, bits).
  std::vector<uint8_t> pack_onnx_codes(const QuantResult& q, int bits);
  // A weight put on the backend (upload of its tensor).
  WeightMatrix upload_weight(const WeightMatrix& w) { return WeightMatrix::of(upload(w.tensor()), w.k_axis); }
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

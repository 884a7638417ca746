// Arrays in, arrays out: the shapes every backend agrees on. The kernels know no files or graphs.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace nibble::kernels {

// A 2-D weight as stored: row-major [rows, cols] of a float type. k_axis says which axis is the
// reduction dimension K (0 for MatMul's [K, N], 1 for Gemm transB's [N, K]); blocks always run
// along K, so a block is `block` consecutive elements of one output channel. It is a 2-D Tensor
// (tensor.h) with its K axis: `data` and `buffer` say where its bytes are, as a Tensor's do.
struct WeightMatrix {
  DType dtype = DType::kFloat32;
  const void* data = nullptr;  // null when the weight lives only on the backend (`buffer`)
  int64_t rows = 0;
  int64_t cols = 0;
  int k_axis = 0;
  std::shared_ptr<const Buffer> buffer{};

  Tensor tensor() const { return Tensor{dtype, {rows, cols}, data, buffer}; }
  // The 2-D tensor t ([rows, cols]) as a weight whose K axis is k_axis.
  static WeightMatrix of(const Tensor& t, int k_axis) {
    return WeightMatrix{t.dtype, t.data, t.shape.at(0), t.shape.at(1), k_axis, t.buffer};
  }
  size_t bytes() const { return size_t(rows * cols) * dtype_size(dtype); }

  int64_t K() const { return k_axis == 0 ? rows : cols; }
  int64_t N() const { return k_axis == 0 ? cols : rows; }
  // Position of logical element (k, n) in the stored layout.
  size_t index(int64_t k, int64_t n) const { return size_t(k_axis == 0 ? k * cols + n : n * cols + k); }
  // Position of the scale / zero point of block g of column n (G blocks along K), laid out as
  // QuantResult holds them: [G, N] when k_axis == 0, [N, G] when k_axis == 1.
  size_t param_index(int64_t G, int64_t g, int64_t n) const { return size_t(k_axis == 0 ? g * cols + n : n * G + g); }
};

// Whose arithmetic plain RTN (Backend::rtn) follows. kModelOpt: numpy's, as ModelOpt writes it (symmetric:
// amax / (2^(b-1) - 1); with a zero point the block's own [min, max], a partial block zero-padded; halves to
// even; the zero point from the stored scale; w / s in the weight's type). kOnnxRuntime: MLAS's blockwise
// quantizer, symmetric or with a zero point (kernels/hd_float.h params_symmetric_ort, params_zero_point_ort,
// quantize_ort).
enum class RtnArithmetic { kModelOpt, kOnnxRuntime };

struct QuantSpec {
  int bits = 4;             // 4 or 8
  int64_t block = 128;      // resolved block length along K (K itself for per-channel)
  // Asymmetric codes in [0, 2^bits - 1] with a zero point per block. The one name everywhere: a bool
  // `zero_point` says the format stores zero points (`zp` in a function's locals), `zero_points` hold
  // them, and `float_zero_point(s)` is HQQ's fractional kind (QuantResult::float_zero_points).
  bool zero_point = false;
  // Type the scales are rounded to when it differs from the data's (nibble-mode AWQ quantizes an
  // fp32 W ⊙ s of an fp16/bf16 weight); kUndefined: the data's own dtype.
  DType scale_dtype = DType::kUndefined;
  // Read by Backend::rtn only (every other operation has its own arithmetic).
  RtnArithmetic rtn_arithmetic = RtnArithmetic::kModelOpt;
};

inline DType scale_type(const QuantSpec& s, DType data) {
  return s.scale_dtype == DType::kUndefined ? data : s.scale_dtype;
}

inline int64_t num_blocks(int64_t K, int64_t block) { return (K + block - 1) / block; }

// Result of quantizing one weight. Codes keep the stored layout of the weight ([rows, cols]),
// one byte per element: two's complement for symmetric codes (so the low nibble is the INT4
// encoding), the unsigned code for zero-point mode. Scales and zero points are laid out as the
// ONNX DequantizeLinear of the stored weight wants them: [G, N] when k_axis == 0, [N, G] when
// k_axis == 1. Scales hold values exactly representable in the weight dtype.
struct QuantResult {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<uint8_t> zero_points;  // empty unless spec.zero_point
  // Fractional zero points (HqqOptions::float_zero_point), laid out as scales and exactly representable
  // in their type: a code c stands for (c - z) * s. Empty otherwise. With them, zero_points hold only
  // the nearest code to each z (what padding in a packed layout carries), not what the codes used.
  std::vector<float> float_zero_points;
  // The 4-bit codes already in ONNX INT4/UINT4 raw_data packing (two a byte, low nibble first), as a
  // device backend brings them back (half the bytes of `codes`), or as `pack` asked; empty when the
  // backend did not (the CPU unasked, 8 bits). Backend::pack_onnx_codes returns them as they are. `codes`
  // holds the same codes, unless `pack` left it empty.
  std::vector<uint8_t> packed;
  // The caller's request, set before Backend::rtn (every other operation ignores it): at 4 bits, the codes
  // in `packed` only, `codes` left empty, for a writer of ONNX INT4 that reads nothing else. Why: a 7B
  // model's codes are 6.7 GB one a byte; written packed by the kernel, they are 3.4 GB and no pass packs them.
  bool pack = false;
  // The caller's request, set before the operation (the destination's placement): leave the codes, scales
  // and integer zero points on the backend, for the MatMulNBits packings that follow, which then read them
  // there (only what they write comes back). The CPU ignores it: its result is host memory.
  bool keep = false;
  // What a device kept when asked: the codes [rows, cols] as a tensor whose buffer also holds the scales and
  // zero points (only that backend's pack_matmulnbits_weight, matmulnbits_scales and
  // pack_matmulnbits_zero_points read them). `codes`, `packed`, `scales` and `zero_points` are then empty
  // (float_zero_points and sq_error come back as ever). Empty when nothing was kept (the CPU, or a result
  // that did not fit beside what the device holds).
  Tensor kept;
  int64_t groups = 0;                // G = ceil(K / block)
  double sq_error = 0;               // sum over elements of (w - dequant(q))^2
};

}  // namespace nibble::kernels

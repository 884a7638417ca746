// Round-to-nearest block quantization, the reference every other backend is tested against.
// The formulas are ModelOpt's, evaluated in the weight's own float type
// the way numpy does it: each operation in fp32, the result rounded to the weight dtype (fp16
// models are processed in fp16 by ModelOpt; bf16, which ModelOpt does not handle, rounds only
// the scale and divides in fp32).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/clip_candidate.h"
#include "kernels/quant_types.h"

namespace nibble::kernels {

// Scale and zero point of one block.
struct BlockParams {
  float scale = 1.0f;
  uint8_t zero_point = 0;
};

// Throws std::invalid_argument unless bits is 4 or 8 and the block positive.
void check_spec(const QuantSpec& spec);

// The smallest scale, ModelOpt's CLIP_MIN = 1e-5 in the weight dtype.
float min_scale(DType t);

// Symmetric: s = max(amax / (2^(b-1) - 1), 1e-5).
BlockParams block_params_symmetric(float amax, int bits, DType t);
// Zero point: s = max(mx - mn, 1e-5) / (2^b - 1), z = clip(-rint(mn / s), 0, 2^b - 1).
// mn/mx must already include the zero padding of a partial block.
BlockParams block_params_zero_point(float mn, float mx, int bits, DType t);

// Candidate ci of a clip search over `ratios` (kernels/clip_candidate.h, the step every backend shares).
inline BlockParams clip_candidate(const std::vector<float>& ratios, int64_t ci, float amax, float mn, float mx,
                                  int bits, bool zero_point, DType st) {
  const hd::Params p =
      hd::clip_candidate(ratios.data(), int64_t(ratios.size()), ci, amax, mn, mx, bits, zero_point, int(st));
  BlockParams b;
  b.scale = p.scale;
  b.zero_point = p.zero_point;
  return b;
}

// Code byte of one value: two's complement in [-2^(b-1), 2^(b-1)-1] (symmetric) or the unsigned
// code in [0, 2^b - 1] (zero point).
uint8_t quantize_value(float w, const BlockParams& p, int bits, bool zero_point, DType t);
// The value a code stands for, in fp32.
float dequantize_value(uint8_t code, const BlockParams& p, int bits, bool zero_point);

// Quantizes a whole weight (multi-threaded, result independent of the thread count).
void rtn_quantize_ref(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out);

}  // namespace nibble::kernels

namespace nibble::kernels {

// RTN with a per-block clip search: every block tries scales r * (its RTN scale) for r in
// `ratios` and keeps the one with the smallest weighted error sum_k weight[k] * (w_k - ŵ_k)^2
// (weight: one value per K channel, e.g. the activation energy diag(XᵀX) of that input channel).
// Symmetric codes may reach -2^(b-1) when r < 1. Zero-point mode scales the block's [min, max].
void rtn_quantize_weighted(const WeightMatrix& w, const QuantSpec& spec, const float* weight,
                           const std::vector<float>& ratios, QuantResult& out);

}  // namespace nibble::kernels

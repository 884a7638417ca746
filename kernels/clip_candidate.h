// The one candidate step of every clip search, NIBBLE_HD: RTN's weighted search, the Gram clip search
// and GPTQ's block parameters call it on the CPU (reference and fast kernels, through
// kernels/cpu/rtn_ref.h) and in the CUDA kernel bodies (kernels/cuda/rtn_kernels.h), so every backend
// tries the very same scales and zero points.
#pragma once
#include <cstdint>

#include "kernels/hd_float.h"

namespace nibble::kernels::hd {

// Candidate ci of a block with |max| amax and range [mn, mx] (mn, mx including a partial block's zero
// padding): ratio r = ratios[ci % R] of its symmetric scale, r·amax, or with a zero point of its range,
// [r·mn, r·mx]; for ci >= R the scale is negated, so that the block's extreme value lands on the
// otherwise unused code -2^(b-1). Scales are rounded to scale_dtype (a DType number).
NIBBLE_HD inline Params clip_candidate(const float* ratios, int64_t R, int64_t ci, float amax, float mn, float mx,
                                       int bits, bool zero_point, int scale_dtype) {
  const float r = ratios[ci % R];
  Params p = zero_point ? params_zero_point(r * mn, r * mx, bits, scale_dtype)
                        : params_symmetric(r * amax, bits, scale_dtype);
  if (ci >= R) p.scale = -p.scale;
  return p;
}

}  // namespace nibble::kernels::hd

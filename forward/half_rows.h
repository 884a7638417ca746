// fp16 <-> float32 over a run of elements, with the bits of kernels/half_float.h's scalar conversions on
// every pattern (NaNs included): through the CPU's F16C conversions eight at a time where it has them
// (and AVX2), the scalar loop elsewhere. The layer engine converts a 7B layer's fp16 weights and
// activations (10^8 elements per batch); the scalar loop was most of what its products waited for.
#pragma once
#include <cstdint>

namespace nibble::forward {

void halves_to_floats(const uint16_t* h, float* out, int64_t n);
void floats_to_halves(const float* x, uint16_t* out, int64_t n);

}  // namespace nibble::forward

// The dequantized weight s·(q − z) of a quantization result, in the stored layout of the weight: what
// `--format qdq` stores as the float weight when the codes did not come from rounding the original
// weight (GPTQ), so that QuantizeLinear, which rounds x / s again, gives back exactly these codes.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

// Bytes of `out` values laid out like `shape` ([rows, cols] as stored): element (k, n) is
// round_to(out, scale(g, n) * (code − zero point)) with g = k / spec.block, computed in float32
// (the product of a scale of at most 24 significant bits by an integer of at most 9 bits is exact
// whenever it fits in `out`, so only the final store rounds). Symmetric codes are two's complement.
std::vector<uint8_t> dequantize_ref(const WeightMatrix& shape, const QuantSpec& spec, const QuantResult& q, DType out);

}  // namespace nibble::kernels

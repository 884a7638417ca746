// Bit layouts of quantized weights. The one place that owns nibble order: element 2i goes to the
// low nibble, 2i+1 to the high nibble (ONNX INT4/UINT4 and ORT's MatMulNBits agree on this).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

// ONNX INT4/UINT4 raw_data of n codes in row-major order; an odd count leaves the last high
// nibble 0. bits == 8 returns the bytes unchanged.
std::vector<uint8_t> pack_onnx(const std::vector<uint8_t>& codes, int bits);

// Inverse of pack_onnx for n elements (used by tests and the report).
std::vector<uint8_t> unpack_onnx(const std::vector<uint8_t>& packed, size_t n, int bits);

// com.microsoft.MatMulNBits weight input B: uint8 [N, G, layout_block * bits / 8], codes packed
// along K inside each block, unsigned (symmetric codes + 2^(bits-1)). layout_block may exceed
// the quantization block only for a single per-channel block (G == 1), padded to a power of two:
// padding positions hold the code of zero.
std::vector<uint8_t> pack_matmulnbits_weight(const WeightMatrix& shape, const QuantSpec& spec,
                                             const QuantResult& q, int64_t layout_block);

// MatMulNBits scales [N, G] (row-major) from the stored layout of q.scales.
std::vector<float> matmulnbits_scales(const WeightMatrix& shape, const QuantResult& q);

// MatMulNBits zero points: uint8 [N, ceil(G * bits / 8)], packed like B.
std::vector<uint8_t> pack_matmulnbits_zero_points(const WeightMatrix& shape, const QuantSpec& spec,
                                                  const QuantResult& q);

}  // namespace nibble::kernels

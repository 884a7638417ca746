// The CPU backend's rtn_lsq: bit for bit rtn_lsq_ref (kernels/cpu/block_fit.h's per-block search), with
// output channels in the lanes of one vector (16 with AVX-512, 8 with AVX2, 4 otherwise). Each block of
// those channels is read from the weight once into a float tile that stays in L1; every candidate's pass
// then runs over the tile, each lane doing its own channel's float and double operations in the
// reference's order, so the bits are the reference's whatever the ISA. One copy per instruction set (as
// rtn_fast.h's kernels, the same run-time choice).
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

void rtn_lsq_simd(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out);

}  // namespace nibble::kernels

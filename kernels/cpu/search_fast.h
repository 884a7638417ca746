// The CPU backend's rtn_lsq and hqq: bit for bit the references' arithmetic (the same per-block
// bodies, kernels/cpu/block_fit.h), spread over threads by panels of output channels; each panel
// gathers its blocks into contiguous buffers once. No SIMD: the per-block searches branch per
// candidate and per iteration, and run in ~1-3 s on a 135M-parameter model on 2 cores.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

void rtn_lsq_fast(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out);
void hqq_fast(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out);

}  // namespace nibble::kernels

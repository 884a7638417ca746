// The CPU backend's hqq, and the scalar threaded rtn_lsq: bit for bit the references' arithmetic (the
// same per-block bodies, kernels/cpu/block_fit.h), spread over threads by panels of output channels; each
// panel gathers its blocks into contiguous buffers once. No SIMD. The backend's rtn_lsq is rtn_lsq_simd
// (rtn_lsq_fast.h, ~10x faster); rtn_lsq_fast stays as the baseline bench/kernel_rtn_lsq.cc measures.
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

void rtn_lsq_fast(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out);
void hqq_fast(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out);

}  // namespace nibble::kernels

// The calibration-free per-block searches, scalar references: rtn_lsq (least-squares scale search
// around 2^b-level RTN) and hqq (half-quadratic zero point). One block at a time, in order, one
// thread; the per-block bodies are kernels/cpu/block_fit.h. Partial last blocks use their own
// elements only (no zero padding).
#pragma once
#include "kernels/backend.h"

namespace nibble::kernels {

void rtn_lsq_ref(const WeightMatrix& w, const QuantSpec& spec, const RtnSearchOptions& opt, QuantResult& out);
// Throws std::invalid_argument unless spec.zero_point (HQQ fits a zero point).
void hqq_ref(const WeightMatrix& w, const QuantSpec& spec, const HqqOptions& opt, QuantResult& out);

}  // namespace nibble::kernels

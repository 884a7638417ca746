// The CPU backend's RTN: the same arithmetic as rtn_quantize_ref (bit for bit; tested against
// it), arranged for speed: dtype fixed at compile time, row-contiguous passes over [K, N] weights
// that the compiler vectorizes, a branch-free exact rint, and branch-free exact fp16/bf16
// conversions and roundings (kernels/half_float.h) so that fp16/bf16 loops vectorize too.
#pragma once
#include <vector>

#include "kernels/quant_types.h"

namespace nibble::kernels {

void rtn_quantize_fast(const WeightMatrix& w, const QuantSpec& spec, QuantResult& out);

// rtn_quantize_weighted (rtn_ref.h), bit for bit, vectorized over the columns of [K, N] weights.
void rtn_quantize_weighted_fast(const WeightMatrix& w, const QuantSpec& spec, const float* weight,
                                const std::vector<float>& ratios, QuantResult& out);

// The kernels above exist in one copy per instruction set (portable C++, and on x86 with GCC
// also AVX2 and AVX-512 builds of the same source); the best one the CPU runs is used unless a
// test or benchmark forces one. Every copy gives the same bits.
enum class RtnIsa { kAuto, kGeneric, kAvx2, kAvx512 };
std::vector<RtnIsa> rtn_fast_isas();  // the copies this CPU can run, portable first
const char* rtn_isa_name(RtnIsa isa);
void rtn_fast_force_isa(RtnIsa isa);  // kAuto: the best (default); throws if the CPU lacks it
RtnIsa rtn_fast_isa();                // the copy in use

}  // namespace nibble::kernels

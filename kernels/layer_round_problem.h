// What every backend's layer_round_weight and layer_round_step share on the host side: the shape checks of
// a LayerRoundProblem (one line naming the operation and what is wrong) and the element math's view of it
// (kernels/layer_rounding.h's Weight) over whichever memory the backend reads.
#pragma once
#include <stdexcept>
#include <string>

#include "kernels/backend.h"
#include "kernels/layer_rounding.h"

namespace nibble::kernels::layer_round {

inline void check(const LayerRoundProblem& p, const LayerRoundParams& x, const Tensor* g, const char* op) {
  const auto fail = [&](const std::string& why) { throw std::invalid_argument(std::string(op) + ": " + why); };
  if (p.rows <= 0 || p.cols <= 0 || p.block <= 0 || (p.k_axis != 0 && p.k_axis != 1)) fail("an empty weight or block");
  if (p.bits < 2 || p.bits > 8) fail("bits must be in [2, 8]");
  const int64_t n = p.rows * p.cols, scales = p.G() * p.N();
  const auto need = [&](const Tensor& t, DType d, int64_t count, const char* what) {
    if (t.dtype != d || t.elements() != count) fail(std::string(what) + ": " + std::to_string(count) + " values expected");
  };
  need(p.w, DType::kFloat32, n, "w");
  need(p.scale0, DType::kFloat32, scales, "scale0");
  if (p.zero_point) need(p.zero_points, DType::kUInt8, scales, "zero points");
  if (!p.s.empty()) need(p.s, DType::kFloat32, p.K(), "s");
  if (!p.divisor.empty()) need(p.divisor, DType::kFloat32, p.N(), "divisor");
  need(x.v, DType::kFloat32, n, "v");
  need(x.f, DType::kFloat32, scales, "f");
  if (g) need(*g, DType::kFloat32, n, "g");
}

// The element math's view, over the arrays given (host or device pointers: the backend's own).
inline Weight view(const LayerRoundProblem& p, const float* w, const float* scale0, const uint8_t* zp, const float* s,
                   const float* divisor, float* v, float* f) {
  Weight x;
  x.rows = p.rows, x.cols = p.cols, x.k_axis = p.k_axis, x.block = p.block, x.bits = p.bits;
  x.zero_point = p.zero_point, x.scale_dtype = p.scale_dtype;
  x.w = w, x.scale0 = scale0, x.zp = p.zero_point ? zp : nullptr;
  x.s = p.s.empty() ? nullptr : s;
  x.divisor = p.divisor.empty() ? nullptr : divisor;
  x.v = v, x.f = f;
  return x;
}

}  // namespace nibble::kernels::layer_round

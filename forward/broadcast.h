// numpy broadcasting for the element-wise operators: the output shape, each operand's strides in it, and
// a walk over the output that hands each element's operand offsets to a function (the last axis as an
// inner loop with a fixed stride, so a bias or a scalar costs no index arithmetic per element).
#pragma once
#include <cstdint>
#include <vector>

#include "forward/op_call.h"

namespace nibble::forward {

std::vector<int64_t> broadcast_shape(const OpCall& c, const std::vector<std::vector<int64_t>>& shapes);
// Element strides of an operand of `shape` read as `out` (0 along broadcast axes).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out);

// fn(out_index, offset in operand 0, offset in operand 1, ...) for every output element in order.
template <size_t N, class Fn>
void for_each_broadcast(const std::vector<int64_t>& out, const std::vector<int64_t> (&strides)[N], Fn&& fn) {
  int64_t total = 1;
  for (int64_t d : out) total *= d;
  if (total == 0) return;
  const size_t rank = out.size();
  const int64_t inner = rank ? out[rank - 1] : 1;
  int64_t step[N];
  for (size_t k = 0; k < N; ++k) step[k] = rank ? strides[k][rank - 1] : 0;
  std::vector<int64_t> idx(rank, 0);
  int64_t base[N] = {};
  for (int64_t o = 0; o < total; o += inner) {
    int64_t off[N];
    for (size_t k = 0; k < N; ++k) off[k] = base[k];
    for (int64_t j = 0; j < inner; ++j) {
      if constexpr (N == 1) fn(o + j, off[0]);
      if constexpr (N == 2) fn(o + j, off[0], off[1]);
      if constexpr (N == 3) fn(o + j, off[0], off[1], off[2]);
      for (size_t k = 0; k < N; ++k) off[k] += step[k];
    }
    // advance the outer multi-index (axes before the last)
    for (int64_t a = int64_t(rank) - 2; a >= 0; --a) {
      const size_t ua = size_t(a);
      ++idx[ua];
      for (size_t k = 0; k < N; ++k) base[k] += strides[k][ua];
      if (idx[ua] < out[ua]) break;
      for (size_t k = 0; k < N; ++k) base[k] -= strides[k][ua] * out[ua];
      idx[ua] = 0;
    }
  }
}

}  // namespace nibble::forward

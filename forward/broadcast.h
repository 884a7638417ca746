// numpy broadcasting for the element-wise operators: the output shape, each operand's strides in it, and
// a walk over the output that hands each element's operand offsets to a function (the last axis as an
// inner loop with a fixed stride, so a bias or a scalar costs no index arithmetic per element).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "forward/op_call.h"
#include "kernels/parallel.h"

namespace nibble::forward {

std::vector<int64_t> broadcast_shape(const OpCall& c, const std::vector<std::vector<int64_t>>& shapes);
// Element strides of an operand of `shape` read as `out` (0 along broadcast axes).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out);

// fn(out_index, offset in operand 0, offset in operand 1, ...) for the output elements of rows
// [row_begin, row_end) in order, a row being the last axis (the whole output when rank 0).
template <size_t N, class Fn>
void for_each_broadcast_rows(const std::vector<int64_t>& out, const std::vector<int64_t> (&strides)[N], int64_t row_begin,
                             int64_t row_end, Fn&& fn) {
  const size_t rank = out.size();
  const int64_t inner = rank ? out[rank - 1] : 1;
  if (inner == 0 || row_begin >= row_end) return;
  int64_t step[N];
  for (size_t k = 0; k < N; ++k) step[k] = rank ? strides[k][rank - 1] : 0;
  std::vector<int64_t> idx(rank, 0);
  int64_t base[N] = {};
  for (int64_t a = int64_t(rank) - 2, r = row_begin; a >= 0; --a) {  // row_begin's multi-index
    const size_t ua = size_t(a);
    idx[ua] = r % out[ua];
    r /= out[ua];
    for (size_t k = 0; k < N; ++k) base[k] += idx[ua] * strides[k][ua];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t o = row * inner;
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

// The whole output in order.
template <size_t N, class Fn>
void for_each_broadcast(const std::vector<int64_t>& out, const std::vector<int64_t> (&strides)[N], Fn&& fn) {
  const int64_t inner = out.empty() ? 1 : out.back();
  const int64_t total = numel_of(out);
  if (total == 0) return;
  for_each_broadcast_rows(out, strides, 0, total / inner, fn);
}

// The same over the worker threads, in row ranges of about kParallelElements elements: for an fn whose
// elements are independent (each writes its own output), so the result is the same at any thread count.
constexpr int64_t kParallelElements = int64_t(1) << 15;
template <size_t N, class Fn>
void parallel_broadcast(const std::vector<int64_t>& out, const std::vector<int64_t> (&strides)[N], Fn&& fn) {
  const int64_t inner = out.empty() ? 1 : out.back();
  const int64_t total = numel_of(out);
  if (total == 0) return;
  const int64_t rows = total / inner, per = std::max<int64_t>(1, kParallelElements / std::max<int64_t>(inner, 1));
  kernels::parallel_for((rows + per - 1) / per, [&](int64_t chunk) {
    for_each_broadcast_rows(out, strides, chunk * per, std::min(rows, (chunk + 1) * per), fn);
  });
}

// fn(begin, end) over [0, n) in ranges of kParallelElements, over the worker threads.
template <class Fn>
void parallel_ranges(int64_t n, Fn&& fn) {
  kernels::parallel_for((n + kParallelElements - 1) / kParallelElements, [&](int64_t chunk) {
    fn(chunk * kParallelElements, std::min(n, (chunk + 1) * kParallelElements));
  });
}

}  // namespace nibble::forward

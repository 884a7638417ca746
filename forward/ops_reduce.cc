// ReduceMean, ReduceSum and Softmax. Float sums are taken in float64 and rounded once to the value's type
// (ONNX Runtime sums in float32 with its own vector order: the difference is within float32 rounding).
#include <algorithm>
#include <cmath>

#include "forward/broadcast.h"
#include "forward/fast_exp.h"
#include "forward/op_table.h"
#include "forward/softmax_rows.h"

namespace nibble::forward {

namespace {

// Whether the reduced axes are the trailing ones (each output sums one contiguous row): the norms' form.
bool reduces_trailing_rows(const std::vector<bool>& reduced) {
  size_t first = reduced.size();
  while (first > 0 && reduced[first - 1]) --first;
  return first < reduced.size() && std::find(reduced.begin(), reduced.begin() + int64_t(first), true) == reduced.begin() + int64_t(first);
}

// Each row's float64 sum in element order, rows over the worker threads: the general walk's sums exactly.
template <class Load>
void sum_rows(int64_t rows, int64_t cols, std::vector<double>& acc, Load&& load) {
  const int64_t per = std::max<int64_t>(1, kParallelElements / std::max<int64_t>(cols, 1));
  kernels::parallel_for((rows + per - 1) / per, [&](int64_t chunk) {
    for (int64_t r = chunk * per; r < std::min(rows, (chunk + 1) * per); ++r) {
      double a = 0.0;
      for (int64_t j = 0; j < cols; ++j) a += load(r * cols + j);
      acc[size_t(r)] = a;
    }
  });
}

// The float sums of `in` over the reduced axes into acc (one per kept element), in float64.
void float_sums(const Value& in, const std::vector<bool>& reduced, const std::vector<int64_t>& kept_shape,
                int64_t count, std::vector<double>& acc) {
  if (reduces_trailing_rows(reduced)) {
    const int64_t rows = int64_t(acc.size());
    switch (in.storage()) {
      case DType::kFloat32: return sum_rows(rows, count, acc, [x = in.as<float>()](int64_t i) { return double(x[i]); });
      case DType::kFloat16:
        return sum_rows(rows, count, acc, [x = in.as<uint16_t>()](int64_t i) { return double(half_to_float(x[i])); });
      default: break;
    }
  }
  const std::vector<int64_t> strides[1] = {broadcast_strides(kept_shape, in.shape)};
  for_each_broadcast(in.shape, strides, [&](int64_t i, int64_t o) { acc[size_t(o)] += load_float(in.storage(), in.data, size_t(i)); });
}

std::vector<Value> reduce(const OpCall& c, bool mean) {
  const Value& in = c.need(0);
  std::vector<int64_t> axes = c.input(1) ? to_ints(*c.input(1)) : c.ints_attr("axes");
  const bool keepdims = c.int_attr("keepdims", 1) != 0;
  const size_t rank = in.shape.size();
  if (axes.empty() && c.int_attr("noop_with_empty_axes", 0)) return {in};
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) reduced[size_t(normalize_axis(c, a, rank))] = true;
  std::vector<int64_t> kept_shape(rank), out_shape;
  int64_t count = 1;
  for (size_t i = 0; i < rank; ++i) {
    kept_shape[i] = reduced[i] ? 1 : in.shape[i];
    if (reduced[i]) count *= in.shape[i];
    if (!reduced[i] || keepdims) out_shape.push_back(kept_shape[i]);
  }
  const int64_t n_out = numel_of(kept_shape);
  if (in.is_float()) {
    std::vector<double> acc(size_t(n_out), 0.0);
    float_sums(in, reduced, kept_shape, count, acc);
    Floats r(acc.size());
    for (size_t i = 0; i < acc.size(); ++i) r[i] = float(mean ? acc[i] / double(count) : acc[i]);
    return {c.result(in.dtype, out_shape, std::move(r))};
  }
  const std::vector<int64_t> strides[1] = {broadcast_strides(kept_shape, in.shape)};
  const auto x = to_ints(in);
  std::vector<int64_t> acc(size_t(n_out), 0);
  for_each_broadcast(in.shape, strides, [&](int64_t i, int64_t o) { acc[size_t(o)] += x[size_t(i)]; });
  if (mean)
    for (auto& v : acc) v /= count ? count : 1;
  return {from_ints(in.dtype, out_shape, acc)};
}

std::vector<Value> softmax(const OpCall& c) {
  const Value& in = c.need(0);
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", -1), in.shape.size()));
  for (size_t i = axis + 1; i < in.shape.size(); ++i)
    if (in.shape[i] != 1) c.fail("only the last non-trivial axis is supported, not axis " + std::to_string(axis));
  const int64_t cols = in.shape[axis];
  Floats keep;
  const float* x = in.storage() == DType::kFloat32 ? in.as<float>() : (to_floats_into(in, keep), keep.data());
  float* in_place = c.reusable_floats(0, in.shape, in.dtype);  // each row read before it is written
  Floats y(in_place ? 0 : size_t(in.numel()));
  float* out = in_place ? in_place : y.data();
  const int64_t rows = cols ? in.numel() / cols : 0;
  const int64_t per = std::max<int64_t>(1, kParallelElements / std::max<int64_t>(cols, 1));
  kernels::parallel_for((rows + per - 1) / per, [&](int64_t chunk) {  // rows are independent: same bits
    for (int64_t r = chunk * per; r < std::min(rows, (chunk + 1) * per); ++r) {
      const float* in_row = x + r * cols;
      float* row = out + r * cols;
      if (row != in_row) std::copy(in_row, in_row + cols, row);
      softmax_row_mlas(row, cols);
    }
  });
  if (in_place) return {c.result_in(0, in.dtype, in.shape)};
  return {c.result(in.dtype, in.shape, std::move(y))};
}

}  // namespace

void add_reduce_ops(OpTable& t) {
  t[":ReduceMean"] = {[](const OpCall& c) { return reduce(c, true); }, true};
  t[":ReduceSum"] = {[](const OpCall& c) { return reduce(c, false); }, true};
  t[":Softmax"] = {softmax, true};
}

}  // namespace nibble::forward

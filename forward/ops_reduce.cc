// ReduceMean, ReduceSum and Softmax. Float sums are taken in float64 and rounded once to the value's type
// (ONNX Runtime sums in float32 with its own vector order: the difference is within float32 rounding).
#include <cmath>

#include "forward/broadcast.h"
#include "forward/fast_exp.h"
#include "forward/op_table.h"

namespace nibble::forward {

namespace {

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
  const std::vector<int64_t> strides[1] = {broadcast_strides(kept_shape, in.shape)};
  const int64_t n_out = numel_of(kept_shape);
  if (in.is_float()) {
    std::vector<double> acc(size_t(n_out), 0.0);
    for_each_broadcast(in.shape, strides, [&](int64_t i, int64_t o) { acc[size_t(o)] += load_float(in.storage(), in.data, size_t(i)); });
    Floats r(acc.size());
    for (size_t i = 0; i < acc.size(); ++i) r[i] = float(mean ? acc[i] / double(count) : acc[i]);
    return {c.result(in.dtype, out_shape, std::move(r))};
  }
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
  Floats x = to_floats(in);
  const int64_t cols = in.shape[axis];
  for (size_t r = 0; cols && r < x.size() / size_t(cols); ++r) {
    float* row = x.data() + r * size_t(cols);
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, row[j]);
    exp_rows(row, row, cols, m);
    const float s = ordered_sum(row, cols);
    for (int64_t j = 0; j < cols; ++j) row[j] /= s;
  }
  return {c.result(in.dtype, in.shape, std::move(x))};
}

}  // namespace

void add_reduce_ops(OpTable& t) {
  t[":ReduceMean"] = {[](const OpCall& c) { return reduce(c, true); }, true};
  t[":ReduceSum"] = {[](const OpCall& c) { return reduce(c, false); }, true};
  t[":Softmax"] = {softmax, true};
}

}  // namespace nibble::forward

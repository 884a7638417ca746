// Operators that move elements without arithmetic: shapes, views, copies along strides, constants.
// Reshape, Identity, Unsqueeze and Squeeze return views of their input's bytes.
#include <cmath>
#include <cstring>

#include "forward/broadcast.h"
#include "forward/constant.h"
#include "forward/op_table.h"

namespace nibble::forward {

namespace {

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// The elements of `in` at base + Σ idx[d]·strides[d] over the output shape.
Value strided_copy(const OpCall& c, const Value& in, const std::vector<int64_t>& out_shape,
                   const std::vector<int64_t>& strides, int64_t base) {
  if (in.on_device() && c.device && out_shape.size() <= size_t(kernels::Strided::kMaxRank)) {
    kernels::Strided g;
    g.rank = int(out_shape.size());
    for (size_t i = 0; i < out_shape.size(); ++i) g.out[i] = out_shape[i], g.stride[i] = strides[i];
    g.base = base;
    Value v = in;
    v.shape = out_shape;
    v.device = c.device->forward_strided(in.device, g);
    v.device.shape = device_shape(out_shape);
    return v;
  }
  if (in.on_device()) c.fail("a strided copy of rank " + std::to_string(out_shape.size()) + " on the device");
  void* p = nullptr;
  Value out = unfilled_value(in.dtype, out_shape, &p);  // every element is copied
  const size_t es = dtype_size(in.dtype);
  const std::vector<int64_t> s[1] = {strides};
  const auto copy = [&](auto element) {  // elements of one size, over the worker threads
    using E = decltype(element);
    const E* src = static_cast<const E*>(in.data) + base;
    E* dst = static_cast<E*>(p);
    parallel_broadcast(out_shape, s, [&](int64_t i, int64_t o) { dst[i] = src[o]; });
  };
  switch (es) {
    case 1: copy(uint8_t{}); break;
    case 2: copy(uint16_t{}); break;
    case 4: copy(uint32_t{}); break;
    case 8: copy(uint64_t{}); break;
    default: c.fail("elements of " + std::to_string(es) + " bytes");
  }
  return out;
}

Value reshaped(const Value& in, std::vector<int64_t> shape) {
  Value v = in;
  v.shape = std::move(shape);
  if (v.on_device()) v.device.shape = device_shape(v.shape);  // a device value is relabelled the same way
  return v;
}

std::vector<Value> reshape(const OpCall& c) {
  const Value& in = c.need(0);
  std::vector<int64_t> shape = to_ints(c.need(1));
  const bool allowzero = c.int_attr("allowzero", 0) != 0;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowzero) {
      if (i >= in.shape.size()) c.fail("dimension 0 copies an axis the input lacks");
      shape[i] = in.shape[i];
    }
    if (shape[i] == -1) {
      if (infer >= 0) c.fail("more than one -1 in the shape");
      infer = int64_t(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) shape[size_t(infer)] = known ? in.numel() / known : 0;
  if (numel_of(shape) != in.numel())
    c.fail("cannot reshape " + shape_text(in.shape) + " to " + shape_text(shape));
  return {reshaped(in, shape)};
}

std::vector<int64_t> axes_of(const OpCall& c, size_t input) {
  if (const Value* a = c.input(input)) return to_ints(*a);
  return c.ints_attr("axes");
}

std::vector<Value> unsqueeze(const OpCall& c) {
  const Value& in = c.need(0);
  const auto axes = axes_of(c, 1);
  const size_t rank = in.shape.size() + axes.size();
  std::vector<bool> added(rank, false);
  for (int64_t a : axes) added[size_t(normalize_axis(c, a, rank))] = true;
  std::vector<int64_t> shape;
  size_t j = 0;
  for (size_t i = 0; i < rank; ++i) shape.push_back(added[i] ? 1 : in.shape[j++]);
  return {reshaped(in, shape)};
}

std::vector<Value> squeeze(const OpCall& c) {
  const Value& in = c.need(0);
  const auto axes = axes_of(c, 1);
  std::vector<bool> drop(in.shape.size(), axes.empty());
  if (axes.empty())
    for (size_t i = 0; i < in.shape.size(); ++i) drop[i] = in.shape[i] == 1;
  for (int64_t a : axes) {
    const size_t i = size_t(normalize_axis(c, a, in.shape.size()));
    if (in.shape[i] != 1) c.fail("axis " + std::to_string(a) + " has size " + std::to_string(in.shape[i]));
    drop[i] = true;
  }
  std::vector<int64_t> shape;
  for (size_t i = 0; i < in.shape.size(); ++i)
    if (!drop[i]) shape.push_back(in.shape[i]);
  return {reshaped(in, shape)};
}

std::vector<Value> shape_op(const OpCall& c) {
  const Value& in = c.need(0);
  const int64_t r = int64_t(in.shape.size());
  auto clampi = [&](int64_t v) { return std::max<int64_t>(0, std::min<int64_t>(r, v < 0 ? v + r : v)); };
  const int64_t start = clampi(c.int_attr("start", 0));
  const int64_t end = clampi(c.int_attr("end", r));
  std::vector<int64_t> dims;
  for (int64_t i = start; i < end; ++i) dims.push_back(in.shape[size_t(i)]);
  return {from_ints(DType::kInt64, {int64_t(dims.size())}, dims)};
}

std::vector<Value> transpose(const OpCall& c) {
  const Value& in = c.need(0);
  std::vector<int64_t> perm = c.ints_attr("perm");
  const size_t rank = in.shape.size();
  if (perm.empty())
    for (size_t i = 0; i < rank; ++i) perm.push_back(int64_t(rank - 1 - i));
  if (perm.size() != rank) c.fail("perm has " + std::to_string(perm.size()) + " axes for rank " + std::to_string(rank));
  const auto in_strides = strides_of(in.shape);
  std::vector<int64_t> shape(rank), strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    const size_t p = size_t(normalize_axis(c, perm[i], rank));
    shape[i] = in.shape[p];
    strides[i] = in_strides[p];
  }
  return {strided_copy(c, in, shape, strides, 0)};
}

// One part of `in` along `axis`: [begin, begin + size).
Value part_along(const OpCall& c, const Value& in, size_t axis, int64_t begin, int64_t size) {
  auto shape = in.shape;
  shape[axis] = size;
  const auto strides = strides_of(in.shape);
  return strided_copy(c, in, shape, strides, begin * strides[axis]);
}

std::vector<Value> split(const OpCall& c) {
  const Value& in = c.need(0);
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", 0), in.shape.size()));
  const size_t n = size_t(c.node.output_size());
  std::vector<int64_t> sizes = c.input(1) ? to_ints(*c.input(1)) : c.ints_attr("split");
  if (sizes.empty()) {
    const int64_t each = (in.shape[axis] + int64_t(n) - 1) / int64_t(n);
    for (size_t i = 0; i < n; ++i) sizes.push_back(std::min(each, in.shape[axis] - each * int64_t(i)));
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (sizes.size() != n || total != in.shape[axis]) c.fail("the split sizes do not cover axis " + std::to_string(axis));
  std::vector<Value> out;
  int64_t begin = 0;
  for (int64_t s : sizes) {
    out.push_back(part_along(c, in, axis, begin, s));
    begin += s;
  }
  return out;
}

std::vector<Value> concat(const OpCall& c) {
  const Value& first = c.need(0);
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", 0), first.shape.size()));
  auto shape = first.shape;
  shape[axis] = 0;
  for (const Value* v : c.in) {
    if (!v || v->dtype != first.dtype || v->shape.size() != shape.size()) c.fail("inputs of different types or ranks");
    shape[axis] += v->shape[axis];
  }
  void* p = nullptr;
  Value out = new_value(first.dtype, shape, &p);
  const size_t es = dtype_size(first.dtype);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  auto* dst = static_cast<uint8_t*>(p);
  int64_t at = 0;
  for (const Value* v : c.in) {
    const int64_t chunk = v->shape[axis] * inner * int64_t(es);
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + (o * shape[axis] * inner + at) * int64_t(es), static_cast<const uint8_t*>(v->data) + o * chunk,
                  size_t(chunk));
    at += v->shape[axis] * inner;
  }
  return {out};
}

std::vector<Value> slice(const OpCall& c) {
  const Value& in = c.need(0);
  const auto starts = to_ints(c.need(1));
  const auto ends = to_ints(c.need(2));
  std::vector<int64_t> axes = c.input(3) ? to_ints(*c.input(3)) : std::vector<int64_t>{};
  std::vector<int64_t> steps = c.input(4) ? to_ints(*c.input(4)) : std::vector<int64_t>{};
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  const auto in_strides = strides_of(in.shape);
  auto shape = in.shape;
  auto strides = in_strides;
  int64_t base = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t a = size_t(normalize_axis(c, axes[i], in.shape.size()));
    const int64_t d = in.shape[a], step = steps[i];
    if (step == 0) c.fail("step 0");
    auto clamp = [&](int64_t v, int64_t lo, int64_t hi) { return std::max(lo, std::min(hi, v < 0 ? v + d : v)); };
    const int64_t s = step > 0 ? clamp(starts[i], 0, d) : clamp(starts[i], -1, d - 1);
    const int64_t e = step > 0 ? clamp(ends[i], 0, d) : clamp(ends[i], -1, d - 1);
    const int64_t n = step > 0 ? std::max<int64_t>(0, (e - s + step - 1) / step) : std::max<int64_t>(0, (s - e - step - 1) / -step);
    shape[a] = n;
    strides[a] = in_strides[a] * step;
    base += s * in_strides[a];
  }
  return {strided_copy(c, in, shape, strides, base)};
}

std::vector<Value> gather(const OpCall& c) {
  const Value& data = c.need(0);
  const Value& ind = c.need(1);
  const size_t axis = size_t(normalize_axis(c, c.int_attr("axis", 0), data.shape.size()));
  const auto idx = to_ints(ind);
  std::vector<int64_t> shape(data.shape.begin(), data.shape.begin() + int64_t(axis));
  shape.insert(shape.end(), ind.shape.begin(), ind.shape.end());
  shape.insert(shape.end(), data.shape.begin() + int64_t(axis) + 1, data.shape.end());
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= data.shape[i];
  for (size_t i = axis + 1; i < data.shape.size(); ++i) inner *= data.shape[i];
  const int64_t d = data.shape[axis];
  void* p = nullptr;
  Value out = new_value(data.dtype, shape, &p);
  const size_t row = size_t(inner) * dtype_size(data.dtype);
  auto* dst = static_cast<uint8_t*>(p);
  const auto* src = static_cast<const uint8_t*>(data.data);
  for (int64_t o = 0; o < outer; ++o)
    for (size_t j = 0; j < idx.size(); ++j) {
      int64_t k = idx[j] < 0 ? idx[j] + d : idx[j];
      if (k < 0 || k >= d) c.fail("index " + std::to_string(idx[j]) + " is out of range [0, " + std::to_string(d) + ")");
      std::memcpy(dst + (size_t(o) * idx.size() + j) * row, src + size_t(o * d + k) * row, row);
    }
  return {out};
}

std::vector<Value> expand(const OpCall& c) {
  const Value& in = c.need(0);
  const auto shape = broadcast_shape(c, {in.shape, to_ints(c.need(1))});
  return {strided_copy(c, in, shape, broadcast_strides(in.shape, shape), 0)};
}

// Tile: the input repeated repeats[d] times along each axis; any element type, copied byte for byte.
std::vector<Value> tile(const OpCall& c) {
  const Value& in = c.need(0);
  if (in.on_device()) c.fail("a device value (Tile runs on the host)");
  const auto repeats = to_ints(c.need(1));
  if (repeats.size() != in.shape.size()) c.fail("repeats has " + std::to_string(repeats.size()) + " values for rank " + std::to_string(in.shape.size()));
  std::vector<int64_t> shape(in.shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (repeats[d] < 0) c.fail("a negative repeat");
    shape[d] = in.shape[d] * repeats[d];
  }
  const size_t esz = dtype_size(in.storage());
  if (esz == 0) c.fail("no element size for " + dtype_name(in.dtype));
  void* out = nullptr;
  Value v = unfilled_value(in.storage(), shape, &out);
  v.dtype = in.dtype;
  v.wide = in.wide;
  const auto in_strides = strides_of(in.shape);
  const int64_t n = numel_of(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (size_t d = 0; d < shape.size(); ++d) src += (idx[d] % in.shape[d]) * in_strides[d];
    std::memcpy(static_cast<uint8_t*>(out) + size_t(i) * esz, static_cast<const uint8_t*>(in.data) + size_t(src) * esz, esz);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return {v};
}

// Range(start, limit, delta): max(ceil((limit - start) / delta), 0) values, integers or floats.
std::vector<Value> range(const OpCall& c) {
  const Value& start = c.need(0);
  if (start.is_float()) {
    const float a = to_floats(start).at(0), b = to_floats(c.need(1)).at(0), d = to_floats(c.need(2)).at(0);
    if (d == 0.0f) c.fail("delta is 0");
    const int64_t n = std::max<int64_t>(0, int64_t(std::ceil((b - a) / d)));
    Floats f(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) f[size_t(i)] = a + float(i) * d;
    return {from_floats(start.dtype, {n}, std::move(f))};
  }
  const int64_t a = to_ints(start).at(0), b = to_ints(c.need(1)).at(0), d = to_ints(c.need(2)).at(0);
  if (d == 0) c.fail("delta is 0");
  const int64_t n = std::max<int64_t>(0, (b - a + d + (d > 0 ? -1 : 1)) / d);
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = a + i * d;
  return {from_ints(start.dtype, {n}, r)};
}

std::vector<Value> constant_of_shape(const OpCall& c) {
  const auto shape = to_ints(c.need(0));
  Value fill = from_floats(DType::kFloat32, {1}, {0.0f});
  if (const auto* t = c.tensor_attr("value")) fill = constant_value(*t);
  const size_t es = dtype_size(fill.dtype);
  void* p = nullptr;
  Value out = new_value(fill.dtype, shape, &p);
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(static_cast<uint8_t*>(p) + size_t(i) * es, fill.data, es);
  return {out};
}

// Trilu: the upper (or lower) triangle of the last two axes, diagonal offset k; the rest zero.
std::vector<Value> trilu(const OpCall& c) {
  const Value& in = c.need(0);
  if (in.shape.size() < 2) c.fail("needs at least two axes");
  const int64_t k = c.input(1) ? to_ints(*c.input(1)).at(0) : 0;
  const bool upper = c.int_attr("upper", 1) != 0;
  const int64_t rows = in.shape[in.shape.size() - 2], cols = in.shape.back();
  void* p = nullptr;
  Value out = new_value(in.dtype, in.shape, &p);
  const size_t es = dtype_size(in.dtype);
  for (int64_t i = 0; i < in.numel(); ++i) {
    const int64_t col = i % cols, row = (i / cols) % rows;
    const bool keep = upper ? col - row >= k : col - row <= k;
    if (keep) std::memcpy(static_cast<uint8_t*>(p) + size_t(i) * es, static_cast<const uint8_t*>(in.data) + size_t(i) * es, es);
  }
  return {out};
}

std::vector<Value> constant(const OpCall& c) {
  if (const auto* t = c.tensor_attr("value")) return {constant_value(*t)};
  if (c.has_attr("value_float")) return {from_floats(DType::kFloat32, {}, {c.float_attr("value_float", 0)})};
  if (c.has_attr("value_int")) return {from_ints(DType::kInt64, {}, {c.int_attr("value_int", 0)})};
  if (c.has_attr("value_ints")) {
    const auto v = c.ints_attr("value_ints");
    return {from_ints(DType::kInt64, {int64_t(v.size())}, v)};
  }
  c.fail("only value, value_float, value_int and value_ints are supported");
}

}  // namespace

void add_shape_ops(OpTable& t) {
  t[":Reshape"] = {reshape, false};
  t[":Identity"] = {[](const OpCall& c) { return std::vector<Value>{c.need(0)}; }, false};
  t[":Unsqueeze"] = {unsqueeze, false};
  t[":Squeeze"] = {squeeze, false};
  t[":Shape"] = {shape_op, false};
  t[":Transpose"] = {transpose, false};
  t[":Split"] = {split, false};
  t[":Concat"] = {concat, false};
  t[":Slice"] = {slice, false};
  t[":Gather"] = {gather, false};
  t[":Expand"] = {expand, false};
  t[":Tile"] = {tile, false};
  t[":Range"] = {range, false};
  t[":ConstantOfShape"] = {constant_of_shape, false};
  t[":Trilu"] = {trilu, false};
  t[":Constant"] = {constant, false};
}

}  // namespace nibble::forward

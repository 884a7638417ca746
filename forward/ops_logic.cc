// Where and the operators that make its condition (Equal, Less, Greater, LessOrEqual, GreaterOrEqual, Not,
// And, Or): the masks of exported attention graphs. A condition is bool, one byte per element, 0 or 1.
// Float operands are compared as their type holds them (an fp16 value as that fp16 number); the selected
// elements are copied, so Where changes no bits.
#include "forward/broadcast.h"
#include "forward/op_table.h"

namespace nibble::forward {

namespace {

enum class Compare { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual };

template <class T>
bool compare(Compare op, T a, T b) {
  switch (op) {
    case Compare::kEqual: return a == b;
    case Compare::kLess: return a < b;
    case Compare::kGreater: return a > b;
    case Compare::kLessOrEqual: return a <= b;
    case Compare::kGreaterOrEqual: return a >= b;
  }
  return false;
}

std::vector<Value> comparison(const OpCall& c, Compare op) {
  const Value& a = c.need(0);
  const Value& b = c.need(1);
  if (a.is_float() != b.is_float()) c.fail("a float and an integer operand");
  const auto out = broadcast_shape(c, {a.shape, b.shape});
  const std::vector<int64_t> strides[2] = {broadcast_strides(a.shape, out), broadcast_strides(b.shape, out)};
  std::vector<int64_t> r(size_t(numel_of(out)));
  if (a.is_float()) {
    Floats x, y;
    rounded_floats_into(a, x);
    rounded_floats_into(b, y);
    for_each_broadcast(out, strides, [&](int64_t i, int64_t ia, int64_t ib) { r[size_t(i)] = compare(op, x[size_t(ia)], y[size_t(ib)]); });
  } else {
    const auto x = to_ints(a), y = to_ints(b);
    for_each_broadcast(out, strides, [&](int64_t i, int64_t ia, int64_t ib) { r[size_t(i)] = compare(op, x[size_t(ia)], y[size_t(ib)]); });
  }
  return {from_ints(DType::kBool, out, r)};
}

enum class Logic { kAnd, kOr };

std::vector<Value> logic(const OpCall& c, Logic op) {
  const Value& a = c.need(0);
  const Value& b = c.need(1);
  if (a.dtype != DType::kBool || b.dtype != DType::kBool) c.fail("bool operands only");
  const auto out = broadcast_shape(c, {a.shape, b.shape});
  const std::vector<int64_t> strides[2] = {broadcast_strides(a.shape, out), broadcast_strides(b.shape, out)};
  const auto x = to_ints(a), y = to_ints(b);
  std::vector<int64_t> r(size_t(numel_of(out)));
  for_each_broadcast(out, strides, [&](int64_t i, int64_t ia, int64_t ib) {
    r[size_t(i)] = op == Logic::kAnd ? (x[size_t(ia)] && y[size_t(ib)]) : (x[size_t(ia)] || y[size_t(ib)]);
  });
  return {from_ints(DType::kBool, out, r)};
}

std::vector<Value> logical_not(const OpCall& c) {
  const Value& a = c.need(0);
  if (a.dtype != DType::kBool) c.fail("a bool operand only");
  auto x = to_ints(a);
  for (auto& v : x) v = !v;
  return {from_ints(DType::kBool, a.shape, x)};
}

// Where(condition, X, Y): X's element where the condition holds, else Y's, all three broadcast.
std::vector<Value> where(const OpCall& c) {
  const Value& cond = c.need(0);
  const Value& x = c.need(1);
  const Value& y = c.need(2);
  if (cond.is_float()) c.fail("the condition must be bool, not " + dtype_name(cond.dtype));
  if (x.dtype != y.dtype) c.fail("X is " + dtype_name(x.dtype) + " and Y " + dtype_name(y.dtype));
  const auto out = broadcast_shape(c, {cond.shape, x.shape, y.shape});
  const std::vector<int64_t> strides[3] = {broadcast_strides(cond.shape, out), broadcast_strides(x.shape, out),
                                           broadcast_strides(y.shape, out)};
  const auto take = to_ints(cond);
  if (x.is_float()) {
    Floats fx, fy, r(size_t(numel_of(out)));
    rounded_floats_into(x, fx);
    rounded_floats_into(y, fy);
    parallel_broadcast(out, strides, [&](int64_t i, int64_t ic, int64_t ix, int64_t iy) {
      r[size_t(i)] = take[size_t(ic)] ? fx[size_t(ix)] : fy[size_t(iy)];
    });
    return {from_floats(x.dtype, out, std::move(r))};  // every element already of x's type: no rounding
  }
  const auto ix = to_ints(x), iy = to_ints(y);
  std::vector<int64_t> r(size_t(numel_of(out)));
  for_each_broadcast(out, strides, [&](int64_t i, int64_t ic, int64_t a, int64_t b) {
    r[size_t(i)] = take[size_t(ic)] ? ix[size_t(a)] : iy[size_t(b)];
  });
  return {from_ints(x.dtype, out, r)};
}

}  // namespace

void add_logic_ops(OpTable& t) {
  t[":Equal"] = {[](const OpCall& c) { return comparison(c, Compare::kEqual); }};
  t[":Less"] = {[](const OpCall& c) { return comparison(c, Compare::kLess); }};
  t[":Greater"] = {[](const OpCall& c) { return comparison(c, Compare::kGreater); }};
  t[":LessOrEqual"] = {[](const OpCall& c) { return comparison(c, Compare::kLessOrEqual); }};
  t[":GreaterOrEqual"] = {[](const OpCall& c) { return comparison(c, Compare::kGreaterOrEqual); }};
  t[":And"] = {[](const OpCall& c) { return logic(c, Logic::kAnd); }};
  t[":Or"] = {[](const OpCall& c) { return logic(c, Logic::kOr); }};
  t[":Not"] = {logical_not};
  t[":Where"] = {where};
}

}  // namespace nibble::forward

// MatMul (numpy's batched product, leading axes broadcast) and Gemm, in float32 through matmul_blas;
// fp16/bf16 operands are widened first and the result rounded once to their type.
#include <array>
#include <chrono>

#include "forward/broadcast.h"
#include "forward/matmul.h"
#include "kernels/forward_types.h"
#include "forward/op_table.h"

namespace nibble::forward {

namespace {

std::vector<Value> matmul(const OpCall& c) {
  const Value& a = c.need(0);
  const Value& b = c.need(1);
  if (!a.is_float() || !b.is_float()) c.fail("float operands only");
  if (a.shape.size() < 2 || b.shape.size() < 2) c.fail("1-D operands are not supported");
  const int64_t M = a.shape[a.shape.size() - 2], K = a.shape.back();
  const int64_t N = b.shape.back();
  if (b.shape[b.shape.size() - 2] != K) c.fail("shapes " + shape_text(a.shape) + " and " + shape_text(b.shape) + " do not multiply");
  std::vector<int64_t> a_batch(a.shape.begin(), a.shape.end() - 2), b_batch(b.shape.begin(), b.shape.end() - 2);
  Floats ka, kb;
  const float* A = float32_view(&a, ka);
  if (b_batch.empty() && b.storage() != DType::kFloat32 && c.weight_scratch) {
    // A 16-bit weight not widened once for the pass: widened panel by panel into the run's scratch.
    const int64_t rows = a.numel() / K;
    Floats out(static_cast<size_t>(rows * N));
    matmul_widening(c.meter, A, b.storage(), b.as<uint16_t>(), out.data(), rows, K, N, *c.weight_scratch);
    auto shape = a.shape;
    shape.back() = N;
    return {c.result(a.dtype, shape, std::move(out))};
  }
  const float* B = float32_view(&b, kb);
  if (b_batch.empty()) {  // the weight case: every row of A against one B
    const int64_t rows = a.numel() / K;
    Floats out(static_cast<size_t>(rows * N));
    matmul_counted(c.meter, A, B, out.data(), rows, K, N, false, kernels::forward_k_slice(N, K, true));
    auto shape = a.shape;
    shape.back() = N;
    return {c.result(a.dtype, shape, std::move(out))};
  }
  const auto batch = broadcast_shape(c, {a_batch, b_batch});
  const std::vector<int64_t> strides[2] = {broadcast_strides(a_batch, batch), broadcast_strides(b_batch, batch)};
  auto shape = batch;
  shape.push_back(M);
  shape.push_back(N);
  Floats out(static_cast<size_t>(numel_of(shape)));
  std::vector<std::array<int64_t, 2>> operands;  // each product's A and B, side by side on the worker threads
  for_each_broadcast(batch, strides, [&](int64_t, int64_t ia, int64_t ib) { operands.push_back({ia, ib}); });
  if (operands.size() == 1) {
    matmul_counted(c.meter, A + operands[0][0] * M * K, B + operands[0][1] * K * N, out.data(), M, K, N, false,
                   kernels::forward_k_slice(N, K, false));
    return {c.result(a.dtype, shape, std::move(out))};
  }
  const auto t0 = std::chrono::steady_clock::now();
  kernels::parallel_for(int64_t(operands.size()), [&](int64_t i) {
    const auto [ia, ib] = operands[size_t(i)];
    matmul_blas(A + ia * M * K, B + ib * K * N, out.data() + i * M * N, M, K, N, false,
                kernels::forward_k_slice(N, K, false));
  });
  if (c.meter) {
    c.meter->flop += 2.0 * double(operands.size()) * double(M) * double(K) * double(N);
    c.meter->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return {c.result(a.dtype, shape, std::move(out))};
}

// Gemm: alpha · op(A) · op(B) + beta · C, A and B 2-D.
std::vector<Value> gemm(const OpCall& c) {
  const Value& a = c.need(0);
  const Value& b = c.need(1);
  if (a.shape.size() != 2 || b.shape.size() != 2) c.fail("A and B must be 2-D");
  if (c.int_attr("transA", 0)) c.fail("transA is not supported");
  const bool tb = c.int_attr("transB", 0) != 0;
  const int64_t M = a.shape[0], K = a.shape[1], N = tb ? b.shape[0] : b.shape[1];
  if ((tb ? b.shape[1] : b.shape[0]) != K) c.fail("shapes " + shape_text(a.shape) + " and " + shape_text(b.shape) + " do not multiply");
  Floats ka, kb;
  Floats out(static_cast<size_t>(M * N));
  matmul_counted(c.meter, float32_view(&a, ka), float32_view(&b, kb), out.data(), M, K, N, tb,
                 kernels::forward_k_slice(N, K, true));
  const float alpha = c.float_attr("alpha", 1.0f), beta = c.float_attr("beta", 1.0f);
  for (float& v : out) v *= alpha;
  if (const Value* cv = c.input(2)) {
    const auto bias = to_floats(*cv);
    const auto shape = broadcast_shape(c, {cv->shape, {M, N}});
    const std::vector<int64_t> strides[1] = {broadcast_strides(cv->shape, shape)};
    for_each_broadcast(shape, strides, [&](int64_t i, int64_t o) { out[size_t(i)] += beta * bias[size_t(o)]; });
  }
  return {c.result(a.dtype, {M, N}, std::move(out))};
}

}  // namespace

void add_matmul_ops(OpTable& t) {
  t[":MatMul"] = {matmul, true};
  t[":Gemm"] = {gemm, true};
}

}  // namespace nibble::forward

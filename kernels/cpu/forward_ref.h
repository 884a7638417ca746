// The layer engine's forward operations (backend_ops.inc, "The layer engine's forward"): the plain scalar
// definitions on host memory, each element by forward_math.h's bodies, the products as float32 sums in k
// order. The CPU backend runs these (its engine runs forward/'s own operators; a device falls back to
// them where its budget cannot hold a result), and the conformance check compares every backend with them.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace nibble::kernels {

// x's values as float32 (fp16 / bf16 widened); x host memory.
std::vector<float> forward_floats(const Tensor& x);

Tensor forward_widen_ref(const Tensor& t);
Tensor forward_round_ref(const Tensor& x, DType to);
Tensor forward_strided_ref(const Tensor& x, const Strided& g);
Tensor forward_reduce_rows_ref(const Tensor& x, int64_t width, bool mean);
Tensor forward_softmax_rows_ref(const Tensor& x, int64_t width);
// forward_matmul_batched through `product` per batch element (the reference's loops, or sgemm).
Tensor forward_matmul_batched_ref(const Tensor& a, const Tensor& b, bool blas);
// The batch, M, K and N of forward_matmul_batched's operands (their batch dims equal). Throws std::invalid_argument.
void forward_batched_shapes(const Tensor& a, const Tensor& b, int64_t& batch, int64_t& M, int64_t& K, int64_t& N);
Tensor forward_select_rows_ref(const Tensor& x, const std::vector<int64_t>& counted);
// C[M, N] = A[M, K] · B ([K, N], or [N, K] when b_transposed), each output a float32 sum in k order.
void forward_matmul_ref(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed);
// The same products through OpenBLAS's sgemm, K in forward_k_slice's slices (ONNX Runtime's order), OpenBLAS
// on one thread (its bits must not depend on the thread count). forward_matmul_blas: a product of two
// activations (a batch's) on the calling thread; forward_matmul_sgemm: a product with a weight, over
// forward_panel_rows x forward_panel_columns panels on the worker threads.
void forward_matmul_blas(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed);
void forward_matmul_sgemm(const float* A, const float* B, float* C, int64_t M, int64_t K, int64_t N, bool b_transposed);
// The product of forward_matmul's tensors through `product` (the reference's loops, or sgemm).
template <class Product>
Tensor forward_matmul_with(const Tensor& x, const Tensor& w, bool w_transposed, Product product);
Tensor forward_binary_ref(ForwardBinary op, const Tensor& a, const Tensor& b);
Tensor forward_unary_ref(ForwardUnary op, const Tensor& x);
std::vector<Tensor> forward_norm_ref(const NormArgs& a);
std::vector<Tensor> forward_attention_ref(const AttentionArgs& a);

// forward_matmul's shapes: x [.., K], w [K, N] (or [N, K]); M the rows of x. Throws std::invalid_argument.
void forward_matmul_shapes(const Tensor& x, const Tensor& w, bool w_transposed, int64_t& M, int64_t& K, int64_t& N);

template <class Product>
Tensor forward_matmul_with(const Tensor& x, const Tensor& w, bool w_transposed, Product product) {
  int64_t M = 0, K = 0, N = 0;
  forward_matmul_shapes(x, w, w_transposed, M, K, N);
  const std::vector<float> a = forward_floats(x), b = forward_floats(w);
  std::vector<float> c(size_t(M * N));
  product(a.data(), b.data(), c.data(), M, K, N, w_transposed);
  std::vector<int64_t> shape = x.shape;
  shape.back() = N;
  return host_tensor(DType::kFloat32, std::move(shape), std::move(c));
}

}  // namespace nibble::kernels

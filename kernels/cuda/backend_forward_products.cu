// The CUDA backend's forward products: a MatMul against a weight in forward_panel_rows x
// forward_panel_columns panels, and GroupQueryAttention's scores and context as strided batches of one
// product per (batch, kv head), with the heads gathered and rotated, the softmax per row and the context
// scattered by single-source kernels. Each product is the column-major calls that the CPU's row-major
// cblas_sgemm calls become, K in the same slices (forward_k_slice), so the emulated device's OpenBLAS gives
// the CPU's bits; on a GPU K is taken whole (device_k_slice), cuBLAS summing in its own order.
#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/forward_kernels.h"
#include "kernels/cuda/launch.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {

namespace {

// The CPU's K slices (forward_k_slice) where the emulated device must give the CPU's bits; a GPU's cuBLAS
// sums in its own order whatever the slices, so it takes K whole: one call per panel, not one per slice
// (a 7B layer at 32 x 512 tokens would make ~25,000 calls instead of ~1,600).
int64_t device_k_slice(int64_t N, int64_t K, bool weight) {
#ifdef __CUDACC__
  (void)N;
  (void)weight;
  return std::max<int64_t>(K, 1);
#else
  return forward_k_slice(N, K, weight);
#endif
}

}  // namespace

Tensor CudaBackend::forward_matmul(const Tensor& x, const Tensor& w, bool w_transposed) {
  if (x.shape.empty() || w.shape.size() != 2) throw std::invalid_argument("forward_matmul: x [.., K] and a 2-D w");
  const int64_t K = x.shape.back(), N = w_transposed ? w.shape[0] : w.shape[1];
  if ((w_transposed ? w.shape[1] : w.shape[0]) != K) throw std::invalid_argument("forward_matmul: w does not fit x");
  const int64_t M = K ? x.elements() / K : 0;
  std::vector<int64_t> shape = x.shape;
  shape.back() = N;
  if (!forward_fits(uint64_t(M * N + K * N) * 4))
    return on_host("forward_matmul", [&](Backend& h) {
      return h.forward_matmul(forward_host_copy(x), forward_host_copy(w), w_transposed);
    });
  const OpScope op(*dev_, "forward_matmul");
  dev_->count_flops(2.0 * double(M) * double(K) * double(N));
  DeviceBuffer<float> tx, tw;
  const float* A = forward_input(x, tx);
  const float* B = forward_input(w, tw);
  DeviceBuffer<float> C(*dev_, size_t(M * N));
  const int64_t rows = forward_panel_rows(M), cols = forward_panel_columns(N), slice = device_k_slice(N, K, true);
  for (int64_t m0 = 0; m0 < M; m0 += rows)
    for (int64_t n0 = 0; n0 < N; n0 += cols)
      for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += slice) {  // the host's K slices, each added to the sum
        const int m = int(std::min(rows, M - m0)), n = int(std::min(cols, N - n0)), kk = int(std::min(slice, K - k0));
        // Row-major C[m, n] = A[m, K] · B: column-major Cᵀ = op(B)ᵀ · Aᵀ.
        const float* b = w_transposed ? B + n0 * K + k0 : B + k0 * N + n0;
        la().sgemm(w_transposed ? Op::kT : Op::kN, Op::kN, n, m, kk, 1.0f, b, int(w_transposed ? K : N),
                   A + m0 * K + k0, int(K), k0 ? 1.0f : 0.0f, C.get() + m0 * N + n0, int(N));
      }
  return forward_result(std::move(C), std::move(shape));
}

Tensor CudaBackend::forward_matmul_batched(const Tensor& a, const Tensor& b) {
  const size_t r = a.shape.size();
  if (r < 3 || b.shape.size() != r || !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin()) ||
      a.shape[r - 1] != b.shape[r - 2])
    throw std::invalid_argument("forward_matmul_batched: [batch.., M, K] and [batch.., K, N]");
  const int64_t M = a.shape[r - 2], K = a.shape[r - 1], N = b.shape[r - 1];
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) batch *= a.shape[i];
  std::vector<int64_t> shape = a.shape;
  shape.back() = N;
  if (!forward_fits(uint64_t(batch * M * N) * 4))
    return on_host("forward_matmul_batched", [&](Backend& h) {
      return h.forward_matmul_batched(forward_host_copy(a), forward_host_copy(b));
    });
  const OpScope op(*dev_, "forward_matmul_batched");
  dev_->count_flops(2.0 * double(batch) * double(M) * double(K) * double(N));
  DeviceBuffer<float> ta, tb;
  const float* A = forward_input(a, ta);
  const float* B = forward_input(b, tb);
  DeviceBuffer<float> C(*dev_, size_t(batch * M * N));
  // Row-major C_i[M, N] = A_i[M, K] · B_i[K, N]: column-major C_iᵀ = B_iᵀ · A_iᵀ, one product per batch
  // element, K in the host's slices.
  const int64_t slice = device_k_slice(N, K, false);
  for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += slice)
    la().sgemm_strided_batched(Op::kN, Op::kN, int(N), int(M), int(std::min(slice, K - k0)), 1.0f, B + k0 * N, int(N),
                               K * N, A + k0, int(K), M * K, k0 ? 1.0f : 0.0f, C.get(), int(N), M * N, int(batch));
  return forward_result(std::move(C), std::move(shape));
}

std::vector<Tensor> CudaBackend::forward_attention(const AttentionArgs& a) {
  check_attention(a);
  const AttentionShape& g = a.g;
  const int64_t S = g.S, D = g.D, group = g.Hq / g.Hkv, batch = g.B * g.Hkv;
  const int64_t nq = g.B * g.Hq * S * D, nkv = g.B * g.Hkv * S * D, np = g.B * g.Hq * S * S;
  if (!forward_fits(uint64_t(2 * nq + 2 * nkv + np) * 4)) {
    AttentionArgs h = a;
    for (Tensor* t : {&h.query, &h.key, &h.value, &h.cos, &h.sin}) *t = forward_host_copy(*t);
    return on_host("forward_attention", [&](Backend& host) { return host.forward_attention(h); });
  }
  const OpScope op(*dev_, "forward_attention");
  dev_->count_flops(4.0 * double(g.B * g.Hq) * double(S) * double(S) * double(D));
  DeviceBuffer<float> tq, tk, tv, tc, ts;
  const float* query = forward_input(a.query, tq);
  const float* key = g.packed ? nullptr : forward_input(a.key, tk);
  const float* value = g.packed ? nullptr : forward_input(a.value, tv);
  const float* cos = g.rot_half ? forward_input(a.cos, tc) : nullptr;
  const float* sin = g.rot_half ? forward_input(a.sin, ts) : nullptr;
  DeviceBuffer<float> q(*dev_, size_t(nq)), k(*dev_, size_t(nkv)), v(*dev_, size_t(nkv));
  launch(*dev_, g.B * S * (g.Hq + 2 * g.Hkv), GatherHeadBody{g, query, key, value, cos, sin, q.get(), k.get(), v.get()});
  DeviceBuffer<float> p(*dev_, size_t(np));
  // Scores P [group · S, S] = Q Kᵀ per (batch, kv head): column-major Pᵀ = K · Qᵀ.
  const int64_t score_slice = device_k_slice(S, D, false), context_slice = device_k_slice(D, S, false);
  for (int64_t k0 = 0; k0 == 0 || k0 < D; k0 += score_slice)  // the host's K slices, each added to the sum
    la().sgemm_strided_batched(Op::kT, Op::kN, int(S), int(group * S), int(std::min(score_slice, D - k0)), 1.0f,
                               k.get() + k0, int(D), S * D, q.get() + k0, int(D), group * S * D, k0 ? 1.0f : 0.0f,
                               p.get(), int(S), group * S * S, int(batch));
  const DeviceBuffer<int64_t> keys = upload(a.keys.data(), a.keys.size());
  launch(*dev_, g.B * g.Hq * S, SoftmaxBody{g, keys.get(), p.get()});
  // Context [group · S, D] = P V: column-major ctxᵀ = Vᵀ · Pᵀ (into q's buffer, which the scores consumed).
  for (int64_t k0 = 0; k0 == 0 || k0 < S; k0 += context_slice)
    la().sgemm_strided_batched(Op::kN, Op::kN, int(D), int(group * S), int(std::min(context_slice, S - k0)), 1.0f,
                               v.get() + k0 * D, int(D), S * D, p.get() + k0, int(S), group * S * S, k0 ? 1.0f : 0.0f,
                               q.get(), int(D), group * S * D, int(batch));
  DeviceBuffer<float> out(*dev_, size_t(nq));
  launch(*dev_, nq, ScatterContextBody{g, q.get(), out.get()});
  std::vector<Tensor> r;
  r.push_back(forward_result(std::move(out), {g.B, S, g.Hq * D}));
  r.push_back(forward_result(std::move(k), {g.B, g.Hkv, S, D}));
  r.push_back(forward_result(std::move(v), {g.B, g.Hkv, S, D}));
  return r;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

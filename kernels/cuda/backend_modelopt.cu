// The CUDA backend's ModelOpt-mode operations: the clip search on the token sample and the sibling
// weights' joint statistic. Both compute the CPU backend's float32 arithmetic in its order
// (modelopt_kernels.h), so the emulated device returns the CPU's bits, and so does a GPU (nvcc
// --fmad=false; no library reduction is involved).
#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/modelopt_kernels.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {

std::vector<float> CudaBackend::awq_weight_mean_joint(const std::vector<WeightMatrix>& siblings, int64_t block) {
  const OpScope op(*dev_, "awq_weight_mean_joint");
  if (siblings.empty()) return {};
  const int64_t K = siblings[0].K();
  int64_t NT = 0;
  DType dt = siblings[0].dtype;
  for (const auto& w : siblings) {
    NT += w.N();
    if (w.dtype != dt) dt = DType::kFloat32;  // mixed dtypes meet in float32, as the CPU's logical_weight
  }
  if ((K * NT) % block != 0) throw std::invalid_argument("weight_mean_joint: K * sum N is not a multiple of the block");
  dev_->count_flops(3.0 * double(K * NT));
  // The siblings side by side, [K, NT] row-major, as ModelOpt concatenates them; each sibling read
  // from its kept copy or uploaded once.
  DeviceBuffer<uint8_t> wc(*dev_, size_t(K * NT) * dtype_size(dt));
  int64_t c0 = 0;
  for (const auto& w : siblings) {
    DeviceBuffer<uint8_t> tmp;
    const WeightView v{weight_on_device(w, tmp), int(w.dtype), w.rows, w.cols, w.k_axis};
    launch(*dev_, K * w.N(), SideBySideBody{v, c0, NT, int(dt), wc.get()});
    dev_->synchronize();  // before `tmp` goes back to the pool
    c0 += w.N();
  }
  // ModelOpt's reshape to [block, -1]: the max over axis 0 is GroupAmaxBody's strided group.
  const int64_t M = K * NT / block;
  const WeightView all{wc.get(), int(dt), K, NT, 0};
  DeviceBuffer<float> amax(*dev_, size_t(M)), mean(*dev_, size_t(K));
  launch(*dev_, M, GroupAmaxBody{all, block, M, false, amax.get()});
  launch(*dev_, K, WeightMeanBody{all, block, M, false, amax.get(), mean.get(), 1e-6f});
  return download(mean);
}

std::vector<float> CudaBackend::clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x,
                                                     int64_t T, const std::vector<double>& ratios, int64_t bsz_col) {
  const OpScope op(*dev_, "clip_search_modelopt");
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
  const int64_t K = w.K(), N = w.N(), B = spec.block, G = num_blocks(K, B), R = int64_t(ratios.size());
  std::vector<float> out(size_t(N * G), 1.0f);
  if (T <= 0 || R == 0) return out;
  if (bsz_col <= 0) bsz_col = N;
  // Products of the weight and each candidate (2 T flops an element), the candidates themselves (~8).
  dev_->count_flops(double(R + 1) * double(G * B) * double(N) * (2.0 * double(T) + 8.0));
  std::vector<float> rr(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) rr[size_t(r)] = hd::round_to(int(w.dtype), float(ratios[size_t(r)]));
  // The token sample once per call, whatever the panels.
  const DeviceBuffer<float> x_d = upload(x, size_t(T * K));
  const DeviceBuffer<float> r_d = upload(rr.data(), rr.size());
  // Columns from `pairwise_from` on lie in ModelOpt chunks of one column (bsz_col 1, or a last chunk
  // of one): numpy sums those pairwise. Otherwise numpy's order is the element-after-element chain.
  const int64_t pairwise_from = bsz_col == 1 ? 0 : (N % bsz_col == 1 ? N - 1 : N);
  const uint64_t per_col = uint64_t(K) * dtype_size(w.dtype) + uint64_t((R + 1) * G * B) * 4 +
                           uint64_t(G * T) * 4 + uint64_t(R * G) * 4 + uint64_t(G) * 4;
  const int64_t width = panel_width(0, per_col, N, "clip_search_modelopt");
  for (int64_t n0 = 0; n0 < N; n0 += width) {
    const int64_t W = std::min(width, N - n0);
    const Panel p = upload_panel(w, n0, W);
    DeviceBuffer<float> wq(*dev_, size_t((R + 1) * G * B * W)), ref(*dev_, size_t(G * T * W)),
        loss(*dev_, size_t(R * G * W)), choice(*dev_, size_t(G * W));
    launch(*dev_, (R + 1) * G * W, MoClipCandidatesBody{p.view, spec.bits, B, R, r_d.get(), wq.get()});
    const MoClipOperands o{x_d.get(), T, K, B, G, R, W, wq.get()};
    const int64_t pw = std::clamp<int64_t>(pairwise_from - n0, 0, W);  // panel columns [pw, W) are pairwise
    launch(*dev_, G * T * pw, MoClipRefBody{o, 0, pw, ref.get()});
    launch(*dev_, R * G * pw, MoClipLossBody{o, 0, pw, ref.get(), loss.get()});
    launch(*dev_, G * T * (W - pw), MoClipRefPairwiseBody{o, pw, W - pw, ref.get()});
    launch(*dev_, R * G * (W - pw), MoClipLossPairwiseBody{o, pw, W - pw, ref.get(), loss.get()});
    launch(*dev_, G * W, MoClipPickBody{loss.get(), r_d.get(), R, G, W, T, choice.get()});
    dev_->synchronize();
    dev_->to_host(out.data() + n0 * G, choice.get(), choice.bytes());
  }
  return out;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

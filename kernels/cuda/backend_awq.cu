// The CUDA backend's AWQ loss and Cholesky factor: single-source kernels for the quantization and
// D = W - Ŵ/s, the linear-algebra layer (cuBLAS or OpenBLAS) for the products with XᵀX or its
// factor U. The weight streams in column panels, and a Gram matrix too large for the budget in row
// panels; each column's sum runs over k in one order whatever the panels, so the loss does not
// depend on the budget except through the BLAS's own summation inside a product.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cuda/awq_kernels.h"
#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/column_dot_kernels.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rtn_blocks.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {

DeviceBuffer<float> CudaBackend::awq_diff(const Panel& p, const QuantSpec& spec, const float* s, const float* diag,
                                          const std::vector<float>* clip) {
  const WeightView& v = p.view;
  const int64_t K = v.K(), width = p.width, n = K * width;
  // W ⊙ s: fp32 when each block picks a clip ratio (scales rounded to the weight dtype), else rounded.
  const int qdt = clip ? int(DType::kFloat32) : v.dtype;
  DeviceBuffer<uint8_t> scaled(*dev_, size_t(n) * (clip ? 4 : dtype_size(DType(v.dtype))));
  launch(*dev_, n, ScaleBody{v.data, v.dtype, qdt, v.cols, v.k_axis, s, scaled.get()});
  const WeightView sv{scaled.get(), qdt, v.rows, v.cols, v.k_axis};
  QuantSpec qs = spec;
  if (clip) qs.scale_dtype = DType(v.dtype);
  DeviceQuant q = quant_buffers(sv, qs);
  const BlockShape shape{spec.bits, spec.block, spec.zero_point, int(scale_type(qs, DType(qdt)))};
  if (clip) {
    DeviceBuffer<float> energy(*dev_, size_t(K));
    launch(*dev_, K, EnergyF32Body{diag, s, energy.get()});
    const DeviceBuffer<float> r = upload(clip->data(), clip->size());
    launch(*dev_, int64_t(q.scales.size()), RtnWeightedBody{sv, shape, q.out(), energy.get(), r.get(), int64_t(clip->size())});
    dev_->synchronize();
  } else {
    launch_rtn(*dev_, sv, shape, q.out());
  }
  DeviceBuffer<float> d(*dev_, size_t(n));
  launch(*dev_, n, AwqDiffBody{v, q.codes.get(), q.scales.get(), spec.zero_point ? q.zero_points.get() : nullptr, spec.block,
                        qdt, s, d.get()});
  dev_->synchronize();
  return d;
}

// acc[n] = Σ_k D(k, n) (G D)(k, n), or Σ_k (U D)(k, n)² with the factor, in column_dot_ref's order
// (ColumnDotBlocks). D is [K, width] row-major, which column-major is X = Dᵀ (width x K); G (or U)
// row-major read column-major is its transpose, so G D = (X Gᵀ)ᵀ and U D = (X Uᵀ)ᵀ, Uᵀ lower triangular.
// Y = X Gᵀ comes out column-major width x K: row-major [K, width], as D.
void CudaBackend::gram_columns(const GramForm& g, const float* on_device, int64_t gram_rows,
                               const DeviceBuffer<float>& d, int64_t width, int64_t tile, double* acc) {
  const int64_t K = g.K, blocks = column_dot_blocks(width);
  const int m = int(width), k = int(K);
  DeviceBuffer<float> y(*dev_, size_t(width * gram_rows));
  if (g.has_upper() && on_device && gram_rows == K) {
    // The CPU's products: one per tile of triangular_loss_chunk(N) columns (the panel starts on a tile).
    for (int64_t c0 = 0; c0 < width; c0 += tile) {
      const int nc = int(std::min(tile, width - c0));
      la().strmm(Side::kRight, Fill::kLower, Op::kN, nc, k, 1.0f, on_device, k, d.get() + c0, m, y.get() + c0, m);
    }
    launch_blocks(*dev_, blocks, ColumnDotBlocks{y.get(), y.get(), K, width, 0, nullptr, true, true, acc});
    dev_->synchronize();
    return;
  }
  // Each column's slice sums carry from one row panel to the next: the same sum whatever the panels.
  DeviceBuffer<double> partial;
  if (gram_rows < K) partial = DeviceBuffer<double>(*dev_, size_t(kColumnSlices * width));
  const float* src = (g.has_upper() ? g.upper : g.gram).f32();
  for (int64_t r0 = 0; r0 < K; r0 += gram_rows) {
    const int64_t nr = std::min(gram_rows, K - r0);
    const bool first = r0 == 0, last = r0 + nr == K;
    DeviceBuffer<float> panel;
    const float* rows = on_device ? on_device + r0 * K : nullptr;
    if (!on_device) {  // rows r0 .. r0 + nr of G (or U), contiguous on the host
      panel = upload(src + r0 * K, size_t(nr * K));
      rows = panel.get();
    }
    if (g.has_upper()) {  // U's rows r0.. are zero left of r0: (U D)[r0:] = X[:, r0:] (Uᵀ)[r0:, r0:r0+nr]
      la().sgemm(Op::kN, Op::kN, m, int(nr), int(K - r0), 1.0f, d.get() + r0 * width, m, rows + r0, k, 0.0f, y.get(), m);
      launch_blocks(*dev_, blocks, ColumnDotBlocks{y.get(), y.get(), nr, width, r0, partial.get(), first, last, acc});
    } else {  // the CPU's products where G is whole: one per tile of kGramLossColumns columns
      for (int64_t c0 = 0; c0 < width; c0 += (nr == K ? tile : width)) {
        const int nc = int(nr == K ? std::min(tile, width - c0) : width);
        la().sgemm(Op::kN, Op::kN, nc, int(nr), k, 1.0f, d.get() + c0, m, rows, k, 0.0f, y.get() + c0, m);
      }
      launch_blocks(*dev_, blocks,
                    ColumnDotBlocks{d.get() + r0 * width, y.get(), nr, width, r0, partial.get(), first, last, acc});
    }
    dev_->synchronize();
  }
}

std::vector<double> CudaBackend::awq_losses(const WeightMatrix& w, const std::vector<const float*>& scales,
                                            const QuantSpec& spec, const GramForm& g,
                                            const std::vector<float>* clip) {
  const OpScope op(*dev_, "awq_losses");
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  // Per scale: scaling, RTN and the difference (~16 flops an element), then ‖U D‖² (K² N multiply-adds
  // over the triangle) or Σ D ⊙ (G D) (2 K² N).
  dev_->count_flops(double(scales.size()) * double(K * N) * (16.0 + (g.has_upper() ? double(K) : 2.0 * double(K))));
  // G on the device alone (the layer engine's statistics): its diagonal is read there.
  const float* gram_on_device = reinterpret_cast<const float*>(kept(g.gram.buffer));
  if (g.K != K || (!g.gram.data && !gram_on_device))
    throw std::invalid_argument("awq_losses: Gram matrix does not match the weight");
  // Per panel column: weight, W ⊙ s, codes, D and one row of Y per Gram row, params and errors, the
  // slice sums carried between Gram row panels.
  const uint64_t per_col = uint64_t(K) * (dtype_size(w.dtype) + 4 + 1 + 4) + uint64_t(G) * 13 + 8 + kColumnSlices * 8;
  const uint64_t fixed = uint64_t(K) * 12 + 4096;
  const uint64_t gram_bytes = uint64_t(K) * uint64_t(K) * 4;
  DeviceBuffer<float> uploaded;
  // U left on the device by gram_cholesky_upper, or G uploaded: read in place, shared by the sibling
  // weights (G only in the GEMM form, when no factor is given). Else the host's copy goes up.
  const Tensor& form = g.has_upper() ? g.upper : g.gram;
  const float* on_device = reinterpret_cast<const float*>(kept(form.buffer));
  if (!on_device && !form.data)
    throw std::invalid_argument("awq_losses: a Gram matrix or factor held by another backend");
  // The Gram diagonal (clip weights): one element per row, from the device's G when it is there.
  DeviceBuffer<float> diag(*dev_, size_t(K));
  if (!g.has_upper() && on_device)
    dev_->on_device_2d(diag.get(), 4, on_device, size_t(K + 1) * 4, 4, size_t(K));
  else if (gram_on_device)
    dev_->on_device_2d(diag.get(), 4, gram_on_device, size_t(K + 1) * 4, 4, size_t(K));
  else
    dev_->to_device_2d(diag.get(), 4, g.gram.f32(), size_t(K + 1) * 4, 4, size_t(K));
  int64_t gram_rows = K, width = 0;
  // The products' column tiles (part of the loss's definition): panels start on them where they can.
  const int64_t tile = g.has_upper() ? triangular_loss_chunk(N) : kGramLossColumns;
  const auto on_tiles = [&](int64_t wd) { return wd < N && wd > tile ? wd - wd % tile : wd; };
  const int64_t want = std::min<int64_t>(N, 64);
  const uint64_t in_use = dev_->in_use_live(), budget = dev_->budget();
  if (on_device) {
    width = on_tiles(panel_width(fixed, per_col + uint64_t(K) * 4, N, "awq_losses"));
  } else if (in_use + fixed + gram_bytes + uint64_t(want) * (per_col + uint64_t(K) * 4) < budget) {
    uploaded = upload(form.f32(), size_t(K * K));
    on_device = uploaded.get();
    width = on_tiles(panel_width(fixed, per_col + uint64_t(K) * 4, N, "awq_losses"));
  } else {  // the Gram matrix streams in row panels beside `want` columns
    width = panel_width(fixed, per_col * 2, want, "awq_losses");
    const uint64_t left = budget - std::min(budget, dev_->in_use_live() + fixed + per_col * uint64_t(width) + 65536);
    gram_rows = std::min<int64_t>(K, int64_t(left / (uint64_t(K) * 4 + uint64_t(width) * 4 + 512)));
    if (gram_rows < 1) throw std::runtime_error("awq_losses: no Gram row fits the device memory budget");
  }
  // The candidate scales go up once; each column's loss stays on the device, and only one sum per
  // scale comes back, summed over the columns in order as the host did.
  const int64_t S = int64_t(scales.size());
  DeviceBuffer<float> s_all(*dev_, size_t(S * K));
  for (int64_t si = 0; si < S; ++si) dev_->to_device(s_all.get() + si * K, scales[size_t(si)], size_t(K) * 4);
  DeviceBuffer<double> acc(*dev_, size_t(S * N)), sums(*dev_, size_t(S));
  dev_->fill_zero(acc.get(), acc.bytes());
  for (int64_t n0 = 0; n0 < N; n0 += width) {
    const Panel p = upload_panel(w, n0, std::min(width, N - n0));
    for (int64_t si = 0; si < S; ++si) {
      const DeviceBuffer<float> d = awq_diff(p, spec, s_all.get() + si * K, diag.get(), clip);
      gram_columns(g, on_device, gram_rows, d, p.width, tile, acc.get() + si * N + n0);
    }
  }
  launch(*dev_, S, RowSumBody{acc.get(), N, sums.get()});
  const std::vector<double> total = download(sums);
  std::vector<double> out;
  for (double sum : total) out.push_back(sum / (double(g.rows) * double(N)));
  return out;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

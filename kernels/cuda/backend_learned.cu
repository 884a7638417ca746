// The CUDA backend's learned rounding: the phases of kernels/learned_rounding.h's learn_row as launches,
// so that the K² residuals are one thread per (row, channel) and only the sequential walks along a row
// are one thread per row:
//   start (per row) → residual (per element) → descent and restore (per row) → residual again (per
//   element, rows whose codes the restore changed) → polish (per row).
// Each thread computes exactly what learn_row computes for its part, in the same order, so the codes and
// statistics are the CPU's bits. Where the arrays (the Gram matrix, five doubles per weight) do not fit
// the budget, the host backend does it.
#include <stdexcept>
#include <vector>

#include "kernels/cuda/backend_impl.h"
#include "kernels/cuda/launch.h"
#include "kernels/learned_rounding.h"

namespace nibble::kernels::gpu::NIBBLE_GPU_NS {
namespace {

constexpr uint64_t kSlack = 64 * 1024;

// Every row's working arrays, row after row: five doubles and a code per weight.
struct RowArrays {
  double* d;
  uint8_t* best;
  int64_t K;
  NIBBLE_HD learned::Row row(int64_t n) const {
    double* b = d + n * 5 * K;
    return learned::Row{b, b + K, b + 2 * K, b + 3 * K, b + 4 * K, best + n * K};
  }
};

struct StartBody {
  learned::Problem p;
  RowArrays a;
  uint8_t* codes;
  NIBBLE_HD void operator()(int64_t n) const { learned::row_start(p, n, codes, a.row(n)); }
};

// r[n, k]; with `redo`, only the rows it marks.
struct ResidualBody {
  learned::Problem p;
  RowArrays a;
  const uint8_t* redo;
  NIBBLE_HD void operator()(int64_t i) const {
    const int64_t n = i / a.K, k = i % a.K;
    if (redo && !redo[n]) return;
    const learned::Row row = a.row(n);
    row.r[k] = learned::residual_at(p, row.e, k);
  }
};

struct DescendBody {
  learned::Problem p;
  RowArrays a;
  uint8_t* codes;
  double* start;
  uint8_t* redo;
  NIBBLE_HD void operator()(int64_t n) const {
    const learned::Row row = a.row(n);
    start[n] = learned::objective(p, row);
    learned::row_descend(p, n, codes, row);
    redo[n] = learned::row_restore(p, n, codes, row) ? 1 : 0;
  }
};

struct PolishBody {
  learned::Problem p;
  RowArrays a;
  uint8_t* codes;
  const uint8_t* given;
  double* end;
  double* sq_error;
  int64_t* moved;
  NIBBLE_HD void operator()(int64_t n) const {
    learned::RowStats st;
    learned::row_polish(p, n, codes, a.row(n), given, st);
    end[n] = st.end, sq_error[n] = st.sq_error, moved[n] = st.moved;
  }
};

}  // namespace

LearnedRoundingStats CudaBackend::learned_rounding(const WeightMatrix& w, const QuantSpec& spec, const Tensor& gram,
                                                   const float* inv_s, const LearnedRoundingOptions& opt,
                                                   QuantResult& q) {
  learned::Problem p = learned::problem_of(w, spec, opt, q);
  const int64_t K = p.K(), N = p.N();
  const uint64_t bytes = uint64_t(K) * uint64_t(K + 1) * 8 + w.bytes() + 2 * q.codes.size() +
                         q.scales.size() * 4 + q.zero_points.size() + uint64_t(N) * uint64_t(K) * 41 +
                         uint64_t(N) * 33;
  std::vector<uint8_t> hbuf;
  // The Gram where the layer engine's statistics left it is read there; a host one goes up.
  const uint8_t* gk = kept(gram.buffer);
  const auto* on_device = gk ? reinterpret_cast<const double*>(gk + mine(gram.buffer)->offset) : nullptr;
  if (gram.dtype != DType::kFloat64 || gram.elements() != K * K || (!on_device && !gram.data))
    throw std::invalid_argument("learned_rounding: gram must be the float64 K x K XᵀX");
  if (dev_->in_use_live() + bytes - (on_device ? uint64_t(K) * uint64_t(K) * 8 : 0) + kSlack > dev_->budget())
    return on_host("learned_rounding", [&](Backend& h) {
      std::vector<uint8_t> gbuf;
      Tensor gh = gram;
      if (!gram.data) {
        gbuf = download(gram);
        gh = host_view(DType::kFloat64, gram.shape, gbuf.data());
      }
      return h.learned_rounding(host_weight(w, hbuf), spec, gh, inv_s, opt, q);
    });
  const OpScope op(*dev_, "learned_rounding");
  // The two residual passes (K² per row, two flops each); the walks are O(K) per step and move.
  dev_->count_flops(0, 4.0 * double(N) * double(K) * double(K));
  std::vector<double> s(size_t(K), 1.0);
  if (inv_s)
    for (int64_t k = 0; k < K; ++k) s[size_t(k)] = double(inv_s[k]);
  std::vector<double> diag(static_cast<size_t>(K));
  if (on_device) {  // only the diagonal comes back, for the dampening
    dev_->synchronize();
    dev_->to_host_2d(diag.data(), sizeof(double), on_device, size_t(K + 1) * sizeof(double), sizeof(double), size_t(K));
  } else {
    for (int64_t k = 0; k < K; ++k) diag[size_t(k)] = gram.f64()[k * K + k];
  }
  p.damp = learned::damp_of_diagonal(diag.data(), s.data(), K, opt.percdamp);
  DeviceBuffer<uint8_t> w_tmp;  // the weight where this backend keeps it (W ⊙ s left by scale_weight), else up
  const uint8_t* w_dev = weight_on_device(w, w_tmp);
  DeviceBuffer<double> gram_up;
  if (!on_device) gram_up = upload(gram.f64(), size_t(K * K));
  const DeviceBuffer<double> s_d = upload(s.data(), s.size());
  const DeviceBuffer<float> scales_d = upload(q.scales.data(), q.scales.size());
  const DeviceBuffer<uint8_t> zp_d = upload(q.zero_points.data(), q.zero_points.size());
  const DeviceBuffer<uint8_t> given_d = upload(q.codes.data(), q.codes.size());
  DeviceBuffer<uint8_t> codes_d = upload(q.codes.data(), q.codes.size());
  DeviceBuffer<double> rows_d(*dev_, size_t(N * K) * 5), start_d(*dev_, size_t(N)), end_d(*dev_, size_t(N)),
      sq_d(*dev_, size_t(N));
  DeviceBuffer<uint8_t> best_d(*dev_, size_t(N * K)), redo_d(*dev_, size_t(N));
  DeviceBuffer<int64_t> moved_d(*dev_, size_t(N));
  p.w = w_dev, p.gram = on_device ? on_device : gram_up.get(), p.s = s_d.get(), p.scales = scales_d.get();
  p.zero_points = q.zero_points.empty() ? nullptr : zp_d.get();
  const RowArrays a{rows_d.get(), best_d.get(), K};
  launch(*dev_, N, StartBody{p, a, codes_d.get()});
  launch(*dev_, N * K, ResidualBody{p, a, nullptr});
  launch(*dev_, N, DescendBody{p, a, codes_d.get(), start_d.get(), redo_d.get()});
  launch(*dev_, N * K, ResidualBody{p, a, redo_d.get()});
  launch(*dev_, N, PolishBody{p, a, codes_d.get(), given_d.get(), end_d.get(), sq_d.get(), moved_d.get()});
  q.codes = download(codes_d);
  q.packed.clear();  // the codes changed
  const std::vector<double> start = download(start_d), end = download(end_d), sq = download(sq_d);
  const std::vector<int64_t> moved = download(moved_d);
  LearnedRoundingStats out;
  q.sq_error = 0;
  for (int64_t n = 0; n < N; ++n) {  // in row order, as the CPU sums them
    out.objective_given += start[size_t(n)];
    out.objective_learned += end[size_t(n)];
    out.moved += moved[size_t(n)];
    q.sq_error += sq[size_t(n)];
  }
  return out;
}

}  // namespace nibble::kernels::gpu::NIBBLE_GPU_NS

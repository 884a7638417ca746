// The CPU backend's AWQ loss and Cholesky factor: OpenBLAS and LAPACK on our own threads.
#include "kernels/cpu/awq_fast.h"

#include <cblas.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/rtn_fast.h"
#include "kernels/dtype.h"
#include "kernels/half_float.h"
#include "kernels/parallel.h"
#include "kernels/tree_reduce.h"

extern "C" void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);

namespace nibble::kernels {

void use_single_threaded_blas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

std::vector<float> gram_cholesky_upper(const double* gram, int64_t K) {
  double dmax = 0;
  for (int64_t k = 0; k < K; ++k) dmax = std::max(dmax, gram[k * K + k]);
  if (!(dmax > 0) || !std::isfinite(dmax)) return {};
  use_single_threaded_blas();
  const int n = int(K);
  std::vector<double> a(size_t(K * K));
  for (double shift : kCholeskyShifts) {
    std::copy(gram, gram + K * K, a.begin());
    for (int64_t k = 0; k < K; ++k) a[size_t(k * K + k)] += shift * dmax;
    // The row-major array read as column-major is Gᵀ = G; LAPACK's lower factor L (G = L Lᵀ), stored
    // column-major, is Lᵀ = U row-major, in the upper triangle.
    int info = 0;
    const char lower = 'L';
    dpotrf_(&lower, &n, a.data(), &n, &info);
    if (info != 0) continue;
    std::vector<float> u(size_t(K * K), 0.0f);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i; j < K; ++j) u[size_t(i * K + j)] = float(a[size_t(i * K + j)]);
    return u;
  }
  return {};
}

namespace {

// loss_weight's clip form (W ⊙ s in fp32, scales rounded to the weight dtype, energy diag(G)[k] / s[k]²)
// into the workspace's buffers, for the [K, N] layout: the same products, in typed row loops that the
// compiler vectorizes, on buffers that outlive the candidate.
template <class Load>
void scale_rows_f32(const void* data, const float* s, int64_t K, int64_t N, float* out, Load load) {
  constexpr int64_t kRows = 16;
  parallel_for(num_blocks(K, kRows), [&](int64_t c) {
    for (int64_t k = c * kRows; k < std::min(K, (c + 1) * kRows); ++k) {
      const float sk = s[k];
      float* o = out + k * N;
      for (int64_t n = 0; n < N; ++n) o[n] = load(data, size_t(k * N + n)) * sk;
    }
  });
}

void clip_loss_weight(const WeightMatrix& w, const float* s, const QuantSpec& spec, const float* gram32,
                      AwqLossWork& work, LossWeight& l) {
  const int64_t K = w.K(), N = w.N();
  l.w = w;
  l.spec = spec;
  l.energy.resize(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) l.energy[size_t(k)] = gram32[k * K + k] / (s[k] * s[k]);
  l.bytes.swap(work.scaled);  // the workspace's buffer, handed back by awq_loss
  l.bytes.resize(size_t(K * N) * sizeof(float));
  float* o = reinterpret_cast<float*>(l.bytes.data());
  if (w.dtype == DType::kFloat16)
    scale_rows_f32(w.data, s, K, N, o, [](const void* p, size_t i) { return half_to_float(static_cast<const uint16_t*>(p)[i]); });
  else if (w.dtype == DType::kBFloat16)
    scale_rows_f32(w.data, s, K, N, o, [](const void* p, size_t i) { return bf16_to_float(static_cast<const uint16_t*>(p)[i]); });
  else
    scale_rows_f32(w.data, s, K, N, o, [](const void* p, size_t i) { return static_cast<const float*>(p)[i]; });
  l.w.dtype = DType::kFloat32;
  l.w.data = l.bytes.data();
  l.spec.scale_dtype = w.dtype;
}

// loss_residual for an fp32 LossWeight in the [K, N] layout (round_to(fp32) is the identity): one row of
// codes, one row of block parameters, the same operations in the same order per element.
void residual_f32_rows(const QuantResult& q, const QuantSpec& spec, const std::vector<float>& w_kn, const float* s,
                       int64_t K, int64_t N, float* d) {
  constexpr int64_t kRows = 16;
  parallel_for(num_blocks(K, kRows), [&](int64_t c) {
    for (int64_t k = c * kRows; k < std::min(K, (c + 1) * kRows); ++k) {
      const int64_t g = k / spec.block;
      const uint8_t* code = q.codes.data() + k * N;
      const float* scale = q.scales.data() + g * N;
      const float* wk = w_kn.data() + k * N;
      const float sk = s[k];
      float* dk = d + k * N;
      if (spec.zero_point) {
        const uint8_t* zp = q.zero_points.data() + g * N;
        for (int64_t n = 0; n < N; ++n) dk[n] = wk[n] - float(int(code[n]) - int(zp[n])) * scale[n] / sk;
      } else {
        for (int64_t n = 0; n < N; ++n) dk[n] = wk[n] - float(int(int8_t(code[n]))) * scale[n] / sk;
      }
    }
  });
}

}  // namespace

double awq_loss(const WeightMatrix& w, const std::vector<float>& w_kn, const float* s, const QuantSpec& spec,
                const float* gram32, int64_t rows, const std::vector<float>* clip_ratios, const float* gram_upper,
                AwqLossWork* work) {
  use_single_threaded_blas();
  const int64_t K = w.K(), N = w.N();
  AwqLossWork local;
  AwqLossWork& wk = work ? *work : local;
  // The [K, N] clip form (every nibble-mode search) in typed loops on reused buffers; others as defined.
  const bool rows_form = clip_ratios != nullptr && w.k_axis == 0;
  LossWeight l;
  if (rows_form) clip_loss_weight(w, s, spec, gram32, wk, l);
  else l = loss_weight(w, s, spec, gram32, clip_ratios != nullptr);
  QuantResult& q = wk.q;
  if (clip_ratios) rtn_quantize_weighted_fast(l.w, l.spec, l.energy.data(), *clip_ratios, q);
  else rtn_quantize_fast(l.w, l.spec, q);
  std::vector<float>& d = wk.d;
  if (rows_form) {
    d.resize(size_t(K * N));
    residual_f32_rows(q, l.spec, w_kn, s, K, N, d.data());
    l.bytes.swap(wk.scaled);
  } else {
    d = loss_residual(l, q, w_kn, s);
  }
  // Each column's sum in column_dot_ref's order (the CUDA backend's), then the columns in order: the
  // same loss as the device's for the same products, whatever the thread count.
  constexpr int64_t kChunk = kGramLossColumns;  // the GEMM form's tiles (modelopt mode)
  std::vector<double>& col = wk.col;
  col.assign(static_cast<size_t>(N), 0.0);
  if (gram_upper != nullptr) {
    // ‖U D‖² = tr(Dᵀ UᵀU D): U·D in place, column chunk by column chunk.
    const int64_t chunk = triangular_loss_chunk(N);
    parallel_for(num_blocks(N, chunk), [&](int64_t c) {
      const int64_t n0 = c * chunk, width = std::min(N, n0 + chunk) - n0;
      cblas_strmm(CblasRowMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, int(K), int(width), 1.0f,
                  gram_upper, int(K), d.data() + n0, int(N));
      column_dots(d.data() + n0, d.data() + n0, K, N, width, col.data() + n0);
    });
  } else {
    // G·D in fixed column chunks, one single-threaded sgemm each on our own threads: no idle BLAS
    // threads spin beside ours.
    std::vector<float> gd(size_t(K * N));
    parallel_for(num_blocks(N, kChunk), [&](int64_t c) {
      const int64_t n0 = c * kChunk, width = std::min(N, n0 + kChunk) - n0;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(K), int(width), int(K), 1.0f, gram32, int(K),
                  d.data() + n0, int(N), 0.0f, gd.data() + n0, int(N));
      column_dots(d.data() + n0, gd.data() + n0, K, N, width, col.data() + n0);
    });
  }
  double sum = 0;
  for (double v : col) sum += v;
  return sum / (double(rows) * double(N));
}

std::vector<float> logical_weight_fast(const WeightMatrix& w) {
  if (w.k_axis != 0) return logical_weight(w);
  const int64_t K = w.K(), N = w.N();
  std::vector<float> out(size_t(K * N));
  constexpr int64_t kRows = 16;
  parallel_for(num_blocks(K, kRows), [&](int64_t c) {
    const size_t i0 = size_t(c * kRows * N), i1 = size_t(std::min(K, (c + 1) * kRows) * N);
    if (w.dtype == DType::kFloat16) {
      const uint16_t* h = static_cast<const uint16_t*>(w.data);
      for (size_t i = i0; i < i1; ++i) out[i] = half_to_float(h[i]);
    } else if (w.dtype == DType::kBFloat16) {
      const uint16_t* h = static_cast<const uint16_t*>(w.data);
      for (size_t i = i0; i < i1; ++i) out[i] = bf16_to_float(h[i]);
    } else {
      for (size_t i = i0; i < i1; ++i) out[i] = load_float(w.dtype, w.data, i);
    }
  });
  return out;
}

std::vector<float> weight_mean_fast(const WeightMatrix& w, int64_t block, bool contiguous) {
  if (!contiguous) return weight_mean(logical_weight_fast(w), w.K(), w.N(), block, false);
  const std::vector<float> kn = logical_weight_fast(w);
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, block);
  std::vector<float> amax(size_t(G * N), 0.0f), out(static_cast<size_t>(K));
  parallel_for(G, [&](int64_t g) {  // the max of each block's column, as weight_mean's (order-free)
    float* a = amax.data() + g * N;
    for (int64_t k = g * block; k < std::min(K, (g + 1) * block); ++k)
      for (int64_t n = 0; n < N; ++n) a[n] = std::max(a[n], std::fabs(kn[size_t(k * N + n)]));
  });
  constexpr int64_t kRows = 16;
  parallel_for(num_blocks(K, kRows), [&](int64_t c) {
    std::vector<float> row(static_cast<size_t>(N));
    for (int64_t k = c * kRows; k < std::min(K, (c + 1) * kRows); ++k) {
      const float* a = amax.data() + (k / block) * N;
      for (int64_t n = 0; n < N; ++n) row[size_t(n)] = std::fabs(kn[size_t(k * N + n)]) / (a[n] + FLT_MIN);
      out[size_t(k)] = numpy_sum_f32(row.data(), N) / float(N);
    }
  });
  return out;
}

void column_dots(const float* a, const float* b, int64_t K, int64_t ld, int64_t width, double* out) {
  constexpr int64_t kTile = 256;  // columns whose slice sums are kept together (32 KiB)
  for (int64_t j0 = 0; j0 < width; j0 += kTile) {
    const int64_t nj = std::min(kTile, width - j0);
    double slice[kColumnSlices][kTile] = {};
    for (int64_t k = 0; k < K; ++k) {  // rows in order: slice k % 16 of every column gets its next term
      const float* ra = a + k * ld + j0;
      const float* rb = b + k * ld + j0;
      double* sl = slice[k % kColumnSlices];
      for (int64_t j = 0; j < nj; ++j) sl[j] += double(ra[j]) * double(rb[j]);
    }
    for (int64_t j = 0; j < nj; ++j) {
      double v[kColumnSlices];
      for (int i = 0; i < kColumnSlices; ++i) v[i] = slice[i][j];
      out[j0 + j] = tree_reduce<kColumnSlices>(v, PlusOp{});
    }
  }
}

}  // namespace nibble::kernels

#include "kernels/cpu/gptq_fast.h"

#include <cblas.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/awq_fast.h"
#include "kernels/cpu/gptq_ref.h"
#include "kernels/parallel.h"

extern "C" void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
extern "C" void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);

namespace nibble::kernels {

GptqFactor gptq_factor_fast(const double* gram, int64_t K, const float* inv_s, double percdamp, bool act_order) {
  use_single_threaded_blas();  // its bits then do not depend on the thread count
  GptqFactor f;
  const std::vector<double> h = gptq_prepare_hessian(gram, K, inv_s, act_order, f);
  const int n = int(K);
  const char lower = 'L';
  for (int attempt = 0; attempt < 5; ++attempt) {
    f.damp = gptq_damp(h, K, percdamp, attempt);
    std::vector<double> a = h;
    for (int64_t k = 0; k < K; ++k) a[size_t(k * K + k)] += f.damp;
    // H is symmetric, so row- and column-major read the same; LAPACK works column-major on the
    // lower triangle throughout.
    int info = 0;
    dpotrf_(&lower, &n, a.data(), &n, &info);
    if (info != 0) continue;
    dpotri_(&lower, &n, a.data(), &n, &info);  // H⁻¹, lower triangle
    if (info != 0) continue;
    for (int64_t j = 0; j < K; ++j)
      for (int64_t i = j + 1; i < K; ++i) a[size_t(i * K + j)] = a[size_t(j * K + i)];  // upper from lower
    dpotrf_(&lower, &n, a.data(), &n, &info);  // H⁻¹ = L2 L2ᵀ (column-major) = UᵀU, U = L2ᵀ
    if (info != 0) continue;
    // Column-major lower L2[i][j] at a[i + j K] is row-major U[j][i] at the same place.
    std::vector<float> u(size_t(K * K), 0.0f);
    for (int64_t r = 0; r < K; ++r)
      for (int64_t c = r; c < K; ++c) u[size_t(r * K + c)] = float(a[size_t(r * K + c)]);
    f.upper = host_tensor(DType::kFloat32, {K, K}, std::move(u));
    return f;
  }
  throw std::runtime_error("GPTQ: the Gram matrix (K = " + std::to_string(K) +
                           ") is not positive definite even with 10^4 times the dampening");
}

namespace {

constexpr int64_t kChunk = 128;  // output columns per task: each task sweeps its columns alone

struct Sweep {
  const WeightMatrix& w;
  const QuantSpec& spec;
  const GptqFactor& f;
  const GptqOptions& opt;
  QuantResult& out;
  std::vector<int64_t> pos;  // sweep position of each channel
};

// Fixes the parameters of block g for columns [n0, n0 + width) at sweep position i of the lazy batch
// [b0, b1): rows past the batch still lack the batch's compensation, added here on the fly.
void fix_block(const Sweep& s, int64_t g, int64_t i, int64_t b0, int64_t b1, int64_t n0, int64_t width,
               const std::vector<float>& wc, const std::vector<float>& err, std::vector<BlockParams>& params) {
  const int64_t K = s.f.K, bs = s.spec.block, k0 = g * bs, k1 = std::min(K, k0 + bs), len = k1 - k0;
  const int64_t G = num_blocks(K, bs);
  const DType st = scale_type(s.spec, s.w.dtype);
  std::vector<float> v(size_t(len * width));
  for (int64_t t = 0; t < len; ++t) {
    const int64_t j = s.pos[size_t(k0 + t)];
    for (int64_t c = 0; c < width; ++c) {
      float x = wc[size_t(j * width + c)];
      if (j >= b1)
        for (int64_t r = b0; r < i; ++r) x -= s.f.upper.f32()[size_t(r * K + j)] * err[size_t((r - b0) * width + c)];
      v[size_t(c * len + t)] = x;
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    const BlockParams p = gptq_block_params(v.data() + c * len, s.f.energy.data() + k0, len, len < bs, s.spec, st, s.opt);
    params[size_t(c)] = p;
    s.out.scales[s.w.param_index(G, g, n0 + c)] = p.scale;
    if (s.spec.zero_point) s.out.zero_points[s.w.param_index(G, g, n0 + c)] = p.zero_point;
  }
}

// GPTQ of columns [n0, n0 + width): returns their squared error against w.
double sweep_chunk(const Sweep& s, int64_t n0, int64_t width) {
  const int64_t K = s.f.K, bs = s.spec.block, G = num_blocks(K, bs), B = std::max<int64_t>(1, s.opt.lazy_block);
  const bool zp = s.spec.zero_point;
  const DType st = scale_type(s.spec, s.w.dtype);
  const float* U = s.f.upper.f32();
  std::vector<float> wc(size_t(K * width));  // rows in sweep order
  for (int64_t i = 0; i < K; ++i) {
    const int64_t k = s.f.perm[size_t(i)];
    for (int64_t c = 0; c < width; ++c)
      wc[size_t(i * width + c)] = s.f.dead[size_t(k)] ? 0.0f : load_float(s.w.dtype, s.w.data, s.w.index(k, n0 + c));
  }
  std::vector<BlockParams> params(size_t(G * width));
  std::vector<uint8_t> fixed(size_t(G), 0);
  std::vector<float> err(size_t(B * width));
  double sq = 0;
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    const int64_t b1 = std::min(K, b0 + B);
    for (int64_t i = b0; i < b1; ++i) {
      const int64_t k = s.f.perm[size_t(i)], g = k / bs;
      if (!fixed[size_t(g)]) {
        std::vector<BlockParams> p(static_cast<size_t>(width));
        fix_block(s, g, i, b0, b1, n0, width, wc, err, p);
        std::copy(p.begin(), p.end(), params.begin() + g * width);
        fixed[size_t(g)] = 1;
      }
      const float d = U[i * K + i];
      float* row = wc.data() + i * width;
      float* e = err.data() + (i - b0) * width;
      for (int64_t c = 0; c < width; ++c) {
        const BlockParams& p = params[size_t(g * width + c)];
        const uint8_t q = quantize_value(row[c], p, s.spec.bits, zp, DType::kFloat32);
        const float deq = round_to(st, dequantize_value(q, p, s.spec.bits, zp));
        s.out.codes[s.w.index(k, n0 + c)] = q;
        const double o = double(load_float(s.w.dtype, s.w.data, s.w.index(k, n0 + c))) - double(deq);
        sq += o * o;
        e[c] = (row[c] - deq) / d;
      }
      for (int64_t j = i + 1; j < b1; ++j) {
        const float u = U[i * K + j];
        float* r = wc.data() + j * width;
        for (int64_t c = 0; c < width; ++c) r[c] -= u * e[c];
      }
    }
    if (b1 < K)  // W[b1:] -= U[b0:b1, b1:]ᵀ · Err
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(K - b1), int(width), int(b1 - b0), -1.0f,
                  U + b0 * K + b1, int(K), err.data(), int(width), 1.0f, wc.data() + b1 * width, int(width));
  }
  return sq;
}

}  // namespace

void gptq_quantize_fast(const WeightMatrix& w, const QuantSpec& spec, const GptqFactor& f, const GptqOptions& opt,
                        QuantResult& out) {
  use_single_threaded_blas();
  const int64_t K = w.K(), N = w.N(), G = num_blocks(K, spec.block);
  if (f.K != K) throw std::invalid_argument("gptq_quantize: factor of K = " + std::to_string(f.K));
  if (!f.upper.data || f.upper.elements() != K * K) throw std::invalid_argument("gptq_quantize: a factor without U on the host");
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.assign(spec.zero_point ? size_t(G * N) : 0, 0);
  Sweep s{w, spec, f, opt, out, std::vector<int64_t>(size_t(K))};
  for (int64_t i = 0; i < K; ++i) s.pos[size_t(f.perm[size_t(i)])] = i;
  const int64_t chunks = num_blocks(N, kChunk);
  std::vector<double> part(size_t(chunks), 0.0);
  parallel_for(chunks, [&](int64_t c) {
    const int64_t n0 = c * kChunk;
    part[size_t(c)] = sweep_chunk(s, n0, std::min(N, n0 + kChunk) - n0);
  });
  out.sq_error = 0;
  for (double p : part) out.sq_error += p;
}

}  // namespace nibble::kernels

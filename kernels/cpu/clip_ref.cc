#include "kernels/cpu/clip_ref.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/awq_ref.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
namespace {

constexpr int L = 16;  // output columns processed side by side (one SIMD lane each)



}  // namespace

std::vector<float> clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x, int64_t T,
                                        const std::vector<double>& ratios, int64_t bsz_col) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  const DType dt = w.dtype;
  const int64_t R = int64_t(ratios.size());
  if (bsz_col <= 0) bsz_col = N;
  std::vector<float> rr(ratios.size());
  for (size_t r = 0; r < ratios.size(); ++r) rr[r] = round_to(dt, float(ratios[r]));
  std::vector<float> out(size_t(N * G), 1.0f);
  if (T <= 0) return out;
  // numpy's reduction order follows the memory layout of ModelOpt's arrays: x * w[chunk] has the
  // output channel innermost (w is a transposed view), so the block sum runs element after element
  // and the token mean token after token. A chunk of ONE column has no such axis: then the block
  // sum is numpy's pairwise sum, and so is the token mean when G == 1.
  auto width1 = [&](int64_t n) { return std::min(N, (n / bsz_col + 1) * bsz_col) - (n / bsz_col) * bsz_col == 1; };
  const int64_t chunks = num_blocks(N, L);
  parallel_for(G * chunks, [&](int64_t task) {
    const int64_t g = task / chunks, n0 = (task % chunks) * L;
    const int64_t k0 = g * bs, kn = std::min(K, k0 + bs) - k0, lanes = std::min<int64_t>(L, N - n0);
    std::vector<float> wb(size_t(bs * L), 0.0f), wq(size_t(R * bs * L), 0.0f);
    std::vector<float> xv(size_t(bs), 0.0f);
    float amax[L] = {};
    for (int64_t i = 0; i < kn; ++i)
      for (int64_t l = 0; l < lanes; ++l) {
        const float v = load_float(dt, w.data, w.index(k0 + i, n0 + l));
        wb[size_t(i * L + l)] = v;
        amax[l] = std::max(amax[l], std::fabs(v));
      }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t l = 0; l < lanes; ++l) {
        // ModelOpt's step, not clip_candidate: the ratio and r·amax are rounded to the weight dtype (numpy).
        const BlockParams p = block_params_symmetric(round_to(dt, amax[l] * rr[size_t(r)]), spec.bits, dt);
        for (int64_t i = 0; i < kn; ++i) {
          const uint8_t c = quantize_value(wb[size_t(i * L + l)], p, spec.bits, false, dt);
          wq[size_t((r * bs + i) * L + l)] = round_to(dt, dequantize_value(c, p, spec.bits, false));
        }
      }
    std::vector<float> loss(size_t(R * L), 0.0f);
    float ref[L], cur[L];
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + t * K + k0;
      for (int64_t i = 0; i < kn; ++i) xv[size_t(i)] = xr[i];
      for (int l = 0; l < L; ++l) ref[l] = 0.0f;
      for (int64_t i = 0; i < bs; ++i)
        for (int l = 0; l < L; ++l) ref[l] += xv[size_t(i)] * wb[size_t(i * L + l)];
      for (int64_t r = 0; r < R; ++r) {
        const float* q = wq.data() + r * bs * L;
        for (int l = 0; l < L; ++l) cur[l] = 0.0f;
        for (int64_t i = 0; i < bs; ++i)
          for (int l = 0; l < L; ++l) cur[l] += xv[size_t(i)] * q[i * L + l];
        float* lr = loss.data() + r * L;
        for (int l = 0; l < L; ++l) lr[l] += (ref[l] - cur[l]) * (ref[l] - cur[l]);
      }
    }
    for (int64_t l = 0; l < lanes; ++l) {
      if (width1(n0 + l)) {  // numpy's pairwise orders (see above)
        std::vector<float> prod(static_cast<size_t>(bs)), sq(static_cast<size_t>(T));
        for (int64_t r = 0; r < R; ++r) {
          float acc = 0.0f;
          for (int64_t t = 0; t < T; ++t) {
            const float* xr = x + t * K + k0;
            for (int64_t i = 0; i < bs; ++i) prod[size_t(i)] = (i < kn ? xr[i] : 0.0f) * wb[size_t(i * L + l)];
            const float rf = numpy_sum_f32(prod.data(), bs);
            for (int64_t i = 0; i < bs; ++i)
              prod[size_t(i)] = (i < kn ? xr[i] : 0.0f) * wq[size_t((r * bs + i) * L + l)];
            const float c = numpy_sum_f32(prod.data(), bs);
            sq[size_t(t)] = (rf - c) * (rf - c);
            acc += sq[size_t(t)];
          }
          loss[size_t(r * L + l)] = G == 1 ? numpy_sum_f32(sq.data(), T) : acc;
        }
      }
      float best_loss = INFINITY, best = 1.0f;
      for (int64_t r = 0; r < R; ++r) {
        // np.mean: the float32 sum divided by the intp count (in float64), stored as float32.
        const float m = float(double(loss[size_t(r * L + l)]) / double(T));
        if (m < best_loss) {
          best_loss = m;
          best = rr[size_t(r)];
        }
      }
      out[size_t((n0 + l) * G + g)] = best;
    }
  });
  return out;
}

void rtn_quantize_ratios(const WeightMatrix& w, const QuantSpec& spec, const float* ratio_ng, QuantResult& out) {
  check_spec(spec);
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  const DType dt = w.dtype;
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.clear();
  std::vector<double> err(size_t(N), 0.0);
  parallel_for(N, [&](int64_t n) {
    double e = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t k0 = g * bs, k1 = std::min(K, k0 + bs);
      float amax = 0;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(load_float(dt, w.data, w.index(k, n))));
      // ModelOpt's step, not clip_candidate: the ratio and r·amax are rounded to the weight dtype (numpy).
      const BlockParams p =
          block_params_symmetric(round_to(dt, amax * round_to(dt, ratio_ng[n * G + g])), spec.bits, dt);
      out.scales[w.param_index(G, g, n)] = p.scale;
      for (int64_t k = k0; k < k1; ++k) {
        const size_t i = w.index(k, n);
        const float v = load_float(dt, w.data, i);
        const uint8_t c = quantize_value(v, p, spec.bits, false, dt);
        out.codes[i] = c;
        const double d = double(v) - double(round_to(dt, dequantize_value(c, p, spec.bits, false)));
        e += d * d;
      }
    }
    err[size_t(n)] = e;
  });
  out.sq_error = 0;
  for (double e : err) out.sq_error += e;
}

}  // namespace nibble::kernels

namespace nibble::kernels {

void clip_quantize_gram_ref(const WeightMatrix& w, const QuantSpec& spec, const double* gram, int64_t gram_block,
                            const float* inv_s, const GramClipOptions& opt, QuantResult& out,
                            std::vector<float>* chosen) {
  check_spec(spec);
  if (gram_block != 0 && gram_block != spec.block) throw std::invalid_argument("gram_block must be 0 or the block");
  const int64_t K = w.K(), N = w.N(), bs = spec.block, G = num_blocks(K, bs);
  const DType dt = w.dtype, st = scale_type(spec, w.dtype);
  const bool zp = spec.zero_point;
  const std::vector<float> ratios = opt.ratios.empty() ? std::vector<float>{1.0f} : opt.ratios;
  const int64_t R = int64_t(ratios.size()), C = R * ((opt.both_signs && !zp) ? 2 : 1);
  out.groups = G;
  out.codes.assign(size_t(w.rows * w.cols), 0);
  out.scales.assign(size_t(G * N), 0.0f);
  out.zero_points.assign(zp ? size_t(G * N) : 0, 0);
  if (chosen) chosen->assign(size_t(N * G), 1.0f);
  out.sq_error = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t k0 = g * bs, kn = std::min(K, k0 + bs) - k0;
    auto gij = [&](int64_t i, int64_t j) {  // G_bb (scaled), rounded to float32 as the fast kernel feeds sgemm
      double v = gram_block ? gram[(g * bs + i) * bs + j] : gram[(k0 + i) * K + (k0 + j)];
      if (inv_s) v *= double(inv_s[k0 + i]) * double(inv_s[k0 + j]);
      return double(float(v));
    };
    for (int64_t n = 0; n < N; ++n) {
      const bool partial = kn < bs;  // ModelOpt's zero padding of a partial last block (zero point range)
      float amax = 0, mn = partial ? 0.0f : INFINITY, mx = partial ? 0.0f : -INFINITY;
      std::vector<float> v(static_cast<size_t>(kn)), d(static_cast<size_t>(kn));
      for (int64_t i = 0; i < kn; ++i) {
        v[size_t(i)] = load_float(dt, w.data, w.index(k0 + i, n));
        amax = std::max(amax, std::fabs(v[size_t(i)]));
        mn = std::min(mn, v[size_t(i)]);
        mx = std::max(mx, v[size_t(i)]);
      }
      // When no loss is below +inf (a NaN or inf in the Gram block), candidate 0 stays.
      BlockParams best = clip_candidate(ratios, 0, amax, mn, mx, spec.bits, zp, st);
      double best_loss = INFINITY;
      int64_t best_ci = 0;
      for (int64_t ci = 0; ci < C; ++ci) {
        const BlockParams p = clip_candidate(ratios, ci, amax, mn, mx, spec.bits, zp, st);
        for (int64_t i = 0; i < kn; ++i)
          d[size_t(i)] = v[size_t(i)] -
                         round_to(dt, dequantize_value(quantize_value(v[size_t(i)], p, spec.bits, zp, dt), p, spec.bits, zp));
        double loss = 0;
        for (int64_t i = 0; i < kn; ++i) {
          double gd = 0;
          for (int64_t j = 0; j < kn; ++j) gd += gij(i, j) * double(d[size_t(j)]);
          loss += double(d[size_t(i)]) * gd;
        }
        if (loss < best_loss) {
          best_loss = loss;
          best = p;
          best_ci = ci;
        }
      }
      const size_t pi = w.param_index(G, g, n);
      out.scales[pi] = best.scale;
      if (zp) out.zero_points[pi] = best.zero_point;
      if (chosen) (*chosen)[size_t(n * G + g)] = best_ci >= R ? -ratios[size_t(best_ci % R)] : ratios[size_t(best_ci)];
      for (int64_t i = 0; i < kn; ++i) {
        const uint8_t code = quantize_value(v[size_t(i)], best, spec.bits, zp, dt);
        out.codes[w.index(k0 + i, n)] = code;
        const double dd = double(v[size_t(i)]) - double(round_to(dt, dequantize_value(code, best, spec.bits, zp)));
        out.sq_error += dd * dd;
      }
    }
  }
}

}  // namespace nibble::kernels

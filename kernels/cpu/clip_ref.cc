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

inline size_t elem_index(const WeightMatrix& w, int64_t k, int64_t n) {
  return size_t(w.k_axis == 0 ? k * w.N() + n : n * w.K() + k);
}
inline size_t param_index(const WeightMatrix& w, int64_t G, int64_t g, int64_t n) {
  return size_t(w.k_axis == 0 ? g * w.N() + n : n * G + g);
}

void check(const QuantSpec& spec) {
  if (spec.bits != 4 && spec.bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (spec.block <= 0) throw std::invalid_argument("block must be positive");
}

}  // namespace

std::vector<double> modelopt_clip_ratios(double step, double alpha_min) {
  std::vector<double> out;
  if (step > 0) {
    // np.arange(start, stop, step): ceil((stop - start) / step) values start + i * step.
    const double n = std::ceil((1.0 - alpha_min) / step);
    for (int64_t i = 0; i < int64_t(n); ++i) {
      const double v = alpha_min + double(i) * step;
      out.push_back(std::nearbyint(v * 100.0) / 100.0);  // Python's round(v, 2)
    }
  }
  out.push_back(1.0);
  return out;
}

std::vector<float> clip_search_modelopt(const WeightMatrix& w, const QuantSpec& spec, const float* x, int64_t T,
                                        const std::vector<double>& ratios, int64_t bsz_col) {
  check(spec);
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
        const float v = load_float(dt, w.data, elem_index(w, k0 + i, n0 + l));
        wb[size_t(i * L + l)] = v;
        amax[l] = std::max(amax[l], std::fabs(v));
      }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t l = 0; l < lanes; ++l) {
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
  check(spec);
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
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(load_float(dt, w.data, elem_index(w, k, n))));
      const BlockParams p =
          block_params_symmetric(round_to(dt, amax * round_to(dt, ratio_ng[n * G + g])), spec.bits, dt);
      out.scales[param_index(w, G, g, n)] = p.scale;
      for (int64_t k = k0; k < k1; ++k) {
        const size_t i = elem_index(w, k, n);
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

void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const double* gram, int64_t gram_block,
                        const float* inv_s, const GramClipOptions& opt, QuantResult& out, std::vector<float>* chosen) {
  check(spec);
  if (gram_block != 0 && gram_block != spec.block) throw std::invalid_argument("gram_block must be 0 or the block");
  use_single_threaded_blas();
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
  constexpr int64_t kCols = 256;
  const int64_t chunks = num_blocks(N, kCols);
  std::vector<double> err(size_t(G * chunks), 0.0);
  parallel_for(G * chunks, [&](int64_t task) {
    const int64_t g = task / chunks, n0 = (task % chunks) * kCols;
    const int64_t k0 = g * bs, kn = std::min(K, k0 + bs) - k0, nc = std::min(N, n0 + kCols) - n0;
    const bool partial = kn < bs;  // ModelOpt's zero padding of a partial last block (zero point range)
    // G_bb (scaled), float32 for sgemm.
    std::vector<float> gb(size_t(kn * kn));
    for (int64_t i = 0; i < kn; ++i)
      for (int64_t j = 0; j < kn; ++j) {
        double v = gram_block ? gram[(g * bs + i) * bs + j] : gram[(k0 + i) * K + (k0 + j)];
        if (inv_s) v *= double(inv_s[k0 + i]) * double(inv_s[k0 + j]);
        gb[size_t(i * kn + j)] = float(v);
      }
    std::vector<float> wb(size_t(kn * nc)), d(size_t(kn * nc)), e(size_t(kn * nc));
    std::vector<float> amax(size_t(nc), 0.0f), mn(size_t(nc), partial ? 0.0f : INFINITY),
        mx(size_t(nc), partial ? 0.0f : -INFINITY);
    for (int64_t i = 0; i < kn; ++i)
      for (int64_t c = 0; c < nc; ++c) {
        const float v = load_float(dt, w.data, elem_index(w, k0 + i, n0 + c));
        wb[size_t(i * nc + c)] = v;
        amax[size_t(c)] = std::max(amax[size_t(c)], std::fabs(v));
        mn[size_t(c)] = std::min(mn[size_t(c)], v);
        mx[size_t(c)] = std::max(mx[size_t(c)], v);
      }
    std::vector<BlockParams> best(static_cast<size_t>(nc)), cand(static_cast<size_t>(nc));
    std::vector<double> best_loss(size_t(nc), INFINITY);
    std::vector<float> best_r(size_t(nc), ratios[0]);
    // When no loss is below +inf (a NaN or inf in the Gram block), candidate 0 stays: never an
    // unset scale.
    for (int64_t c = 0; c < nc; ++c)
      best[size_t(c)] = zp ? block_params_zero_point(ratios[0] * mn[size_t(c)], ratios[0] * mx[size_t(c)], spec.bits, st)
                           : block_params_symmetric(ratios[0] * amax[size_t(c)], spec.bits, st);
    for (int64_t ci = 0; ci < C; ++ci) {
      const float r = ratios[size_t(ci % R)];
      for (int64_t c = 0; c < nc; ++c) {
        BlockParams p = zp ? block_params_zero_point(r * mn[size_t(c)], r * mx[size_t(c)], spec.bits, st)
                           : block_params_symmetric(r * amax[size_t(c)], spec.bits, st);
        if (ci >= R) p.scale = -p.scale;
        cand[size_t(c)] = p;
      }
      if (!zp && dt != DType::kFloat32) {
        // fp16 / bf16: quantize_value / dequantize_value inlined (fp16 quotient rounded to fp16,
        // the dequantized value rounded to the weight dtype)
        const float lo = -float(1 << (spec.bits - 1)), hi = float((1 << (spec.bits - 1)) - 1);
        const bool f16 = dt == DType::kFloat16;
        for (int64_t i = 0; i < kn; ++i) {
          const float* wr = wb.data() + i * nc;
          float* dr = d.data() + i * nc;
          for (int64_t c = 0; c < nc; ++c) {
            const float sc = cand[size_t(c)].scale;
            float q = wr[c] / sc;
            if (f16) q = round_to(dt, q);
            float r = (q + 12582912.0f) - 12582912.0f;
            r = std::min(std::max(r, lo), hi);
            dr[c] = wr[c] - round_to(dt, r * sc);
          }
        }
      } else if (dt == DType::kFloat32 && !zp) {
        // the same arithmetic as quantize_value / dequantize_value for fp32, vectorizable: codes
        // |v / s| < 2^22, so (q + 1.5·2^23) - 1.5·2^23 is rint (half to even)
        const float lo = -float(1 << (spec.bits - 1)), hi = float((1 << (spec.bits - 1)) - 1);
        std::vector<float> sc(static_cast<size_t>(nc));
        for (int64_t c = 0; c < nc; ++c) sc[size_t(c)] = cand[size_t(c)].scale;
        for (int64_t i = 0; i < kn; ++i) {
          const float* wr = wb.data() + i * nc;
          float* dr = d.data() + i * nc;
          for (int64_t c = 0; c < nc; ++c) {
            const float q = wr[c] / sc[size_t(c)];
            float r = (q + 12582912.0f) - 12582912.0f;
            r = std::min(std::max(r, lo), hi);
            dr[c] = wr[c] - r * sc[size_t(c)];
          }
        }
      } else {
        for (int64_t i = 0; i < kn; ++i)
          for (int64_t c = 0; c < nc; ++c) {
            const float v = wb[size_t(i * nc + c)];
            const BlockParams& p = cand[size_t(c)];
            d[size_t(i * nc + c)] =
                v - round_to(dt, dequantize_value(quantize_value(v, p, spec.bits, zp, dt), p, spec.bits, zp));
          }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(kn), int(nc), int(kn), 1.0f, gb.data(), int(kn),
                  d.data(), int(nc), 0.0f, e.data(), int(nc));
      std::vector<double> loss(size_t(nc), 0.0);
      for (int64_t i = 0; i < kn; ++i)
        for (int64_t c = 0; c < nc; ++c) loss[size_t(c)] += double(d[size_t(i * nc + c)]) * double(e[size_t(i * nc + c)]);
      for (int64_t c = 0; c < nc; ++c)
        if (loss[size_t(c)] < best_loss[size_t(c)]) {
          best_loss[size_t(c)] = loss[size_t(c)];
          best[size_t(c)] = cand[size_t(c)];
          best_r[size_t(c)] = ci >= R ? -r : r;
        }
    }
    double te = 0;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t n = n0 + c;
      const BlockParams& p = best[size_t(c)];
      out.scales[param_index(w, G, g, n)] = p.scale;
      if (zp) out.zero_points[param_index(w, G, g, n)] = p.zero_point;
      if (chosen) (*chosen)[size_t(n * G + g)] = best_r[size_t(c)];
      for (int64_t i = 0; i < kn; ++i) {
        const float v = wb[size_t(i * nc + c)];
        const uint8_t code = quantize_value(v, p, spec.bits, zp, dt);
        out.codes[elem_index(w, k0 + i, n)] = code;
        const double dd = double(v) - double(round_to(dt, dequantize_value(code, p, spec.bits, zp)));
        te += dd * dd;
      }
    }
    err[size_t(task)] = te;
  });
  out.sq_error = 0;
  for (double x : err) out.sq_error += x;
}

}  // namespace nibble::kernels

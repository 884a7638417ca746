// The CPU backend's Gram-form clip search: column tiles side by side, the candidate residuals in
// vectorizable loops (the same arithmetic as quantize_value / dequantize_value), one sgemm per
// candidate and block tile. Bit for bit the residuals of clip_quantize_gram_ref; the losses differ
// from it only in float summation order (tested).
#include "kernels/cpu/clip_fast.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/awq_fast.h"
#include "kernels/half_float.h"
#include "kernels/cpu/rtn_ref.h"
#include "kernels/parallel.h"

namespace nibble::kernels {
void clip_quantize_gram(const WeightMatrix& w, const QuantSpec& spec, const double* gram, int64_t gram_block,
                        const float* inv_s, const GramClipOptions& opt, QuantResult& out, std::vector<float>* chosen) {
  check_spec(spec);
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
  constexpr int64_t kCols = kGramClipColumns;
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
        const float v = load_float(dt, w.data, w.index(k0 + i, n0 + c));
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
      best[size_t(c)] = clip_candidate(ratios, 0, amax[size_t(c)], mn[size_t(c)], mx[size_t(c)], spec.bits, zp, st);
    for (int64_t ci = 0; ci < C; ++ci) {
      const float r = ratios[size_t(ci % R)];  // the ratio reported as chosen
      for (int64_t c = 0; c < nc; ++c)
        cand[size_t(c)] = clip_candidate(ratios, ci, amax[size_t(c)], mn[size_t(c)], mx[size_t(c)], spec.bits, zp, st);
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
            float code = rint_small(q);
            code = std::min(std::max(code, lo), hi);
            dr[c] = wr[c] - round_to(dt, code * sc);
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
            float code = rint_small(q);
            code = std::min(std::max(code, lo), hi);
            dr[c] = wr[c] - code * sc[size_t(c)];
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
      out.scales[w.param_index(G, g, n)] = p.scale;
      if (zp) out.zero_points[w.param_index(G, g, n)] = p.zero_point;
      if (chosen) (*chosen)[size_t(n * G + g)] = best_r[size_t(c)];
      for (int64_t i = 0; i < kn; ++i) {
        const float v = wb[size_t(i * nc + c)];
        const uint8_t code = quantize_value(v, p, spec.bits, zp, dt);
        out.codes[w.index(k0 + i, n)] = code;
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

// Learned rounding (backend learned_rounding), one source for every backend: the reference runs these
// functions row after row, the threaded CPU kernel rows in parallel, the CUDA backend's bodies
// (kernels/cuda/backend_learned.cu) one thread per row or per element. All share these expressions, so
// every backend gives the same bits (nvcc --fmad=false, g++ -ffp-contract=off).
//
// The objective of one output row n (rows are independent): L = e H eᵀ with e = w - ŵ (the row of W ⊙ s
// against its dequantized codes) and H = diag(inv_s) XᵀX diag(inv_s) + damp·I, the output error of the
// layer on the calibration tokens. The residual r = e H is kept beside e: moving one weight's code by a
// level changes ŵ_k by d and L by -2·d·r_k + d²·H_kk, and r by -d·H_k. (r_k is written s_k·Σ_j (e_j s_j)
// G_jk + damp·e_k: two flops per element.)
//
// AutoRound's update (Cheng et al. 2023), on that objective: each weight has a continuous offset v_k
// added to its unrounded level u_k = w_k / scale + z before rounding; a step moves v_k by lr_t against the
// sign of ∂L/∂v_k = -2·r_k·scale (straight through the rounding), lr_t falling linearly to 0, and the
// codes of the lowest L seen are kept. v starts where the given codes (GPTQ's) are, and stays within
// half a level beyond both those codes and RTN's. Then greedy sweeps move single levels wherever L falls,
// each weight within the levels around its unrounded value and GPTQ's (neighbourhood).
// The block scales and zero points are not changed.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/backend.h"
#include "kernels/hd_float.h"

namespace nibble::kernels::learned {

// One weight matrix's problem, in device-neutral pointers (host memory on the CPU, device memory on a GPU).
struct Problem {
  const void* w = nullptr;  // the weight as stored, [rows, cols] of `dtype`
  int dtype = hd::kF32;
  int64_t rows = 0, cols = 0;
  int k_axis = 0;
  const double* gram = nullptr;  // XᵀX, K x K row-major
  const double* s = nullptr;     // inv_s as doubles (K), or all ones
  double damp = 0;
  int bits = 4;
  int64_t block = 128;
  bool zero_point = false;
  int scale_dtype = hd::kF32;
  const float* scales = nullptr;  // laid out as QuantResult's
  const uint8_t* zero_points = nullptr;
  int iters = 0;
  double lr = 0;
  int polish_sweeps = 0;

  NIBBLE_HD int64_t K() const { return k_axis == 0 ? rows : cols; }
  NIBBLE_HD int64_t N() const { return k_axis == 0 ? cols : rows; }
  NIBBLE_HD int64_t G() const { return (K() + block - 1) / block; }
  NIBBLE_HD int64_t index(int64_t k, int64_t n) const { return k_axis == 0 ? k * cols + n : n * cols + k; }
  NIBBLE_HD int64_t param(int64_t k, int64_t n) const {
    const int64_t g = k / block;
    return k_axis == 0 ? g * cols + n : n * G() + g;
  }
  NIBBLE_HD int lowest() const { return zero_point ? 0 : -(1 << (bits - 1)); }
  NIBBLE_HD int highest() const { return zero_point ? (1 << bits) - 1 : (1 << (bits - 1)) - 1; }
  NIBBLE_HD int level_of(uint8_t code) const { return zero_point ? int(code) : int(int8_t(code)); }
  NIBBLE_HD uint8_t code_of(int level) const { return zero_point ? uint8_t(level) : uint8_t(int8_t(level)); }
  NIBBLE_HD int zero(int64_t k, int64_t n) const { return zero_point ? int(zero_points[param(k, n)]) : 0; }
  // ŵ as GPTQ and the writers dequantize it: (level - z)·scale rounded to the scale type.
  NIBBLE_HD double dequantized(int level, int64_t k, int64_t n) const {
    return double(hd::round_to(scale_dtype, float(level - zero(k, n)) * scales[param(k, n)]));
  }
  NIBBLE_HD double h_diag(int64_t k) const { return gram[k * K() + k] * s[k] * s[k] + damp; }
};

// percdamp · mean(diag(inv_s) G diag(inv_s)) over the K channels, summed in channel order.
// The same from the Gram matrix's diagonal alone (K values, in the same order: the same bits).
inline double damp_of_diagonal(const double* diag, const double* s, int64_t K, double percdamp) {
  double mean = 0;
  for (int64_t k = 0; k < K; ++k) mean += diag[k] * s[k] * s[k];
  return percdamp * (mean / double(K));
}

inline double damp_of(const double* gram, const double* s, int64_t K, double percdamp) {
  double mean = 0;
  for (int64_t k = 0; k < K; ++k) mean += gram[k * K + k] * s[k] * s[k];
  return percdamp * (mean / double(K));
}

// The Problem's sizes and knobs from the operation's arguments (the pointers are the caller's: host or
// device memory); throws std::invalid_argument where q is not gptq_quantize's kind of result for w.
inline Problem problem_of(const WeightMatrix& w, const QuantSpec& spec, const LearnedRoundingOptions& opt,
                          const QuantResult& q) {
  Problem p;
  p.dtype = int(w.dtype);
  p.rows = w.rows, p.cols = w.cols, p.k_axis = w.k_axis;
  p.bits = spec.bits, p.block = spec.block, p.zero_point = spec.zero_point;
  p.scale_dtype = int(scale_type(spec, w.dtype));
  p.iters = opt.iters, p.lr = opt.lr, p.polish_sweeps = opt.polish_sweeps;
  const size_t params = size_t(p.G() * p.N());
  if (q.codes.size() != size_t(w.rows * w.cols) || q.scales.size() != params ||
      q.zero_points.size() != (spec.zero_point ? params : 0))
    throw std::invalid_argument("learned_rounding: the given result is not of this " + std::to_string(w.rows) + " x " +
                                std::to_string(w.cols) + " weight (host codes, scales and zero points)");
  if (opt.iters < 0 || !(opt.lr >= 0) || opt.polish_sweeps < 0 || !(opt.percdamp >= 0))
    throw std::invalid_argument("learned_rounding: negative iterations, step or dampening");
  return p;
}

// One row's working arrays, K values each.
struct Row {
  double* e;   // w - ŵ
  double* r;   // e H
  double* u;   // unrounded level w / scale + z
  double* v;   // offset
  double* v0;  // offset of the given codes
  uint8_t* best;  // codes of the lowest objective seen
};

// What a row reports: the objective of the given codes, of the final ones, and how many codes moved.
struct RowStats {
  double start = 0, end = 0, sq_error = 0;
  int64_t moved = 0;
};

// e and u of row n from its codes (codes laid out as the weight), v = v0, best = codes.
NIBBLE_HD inline void row_start(const Problem& p, int64_t n, const uint8_t* codes, const Row& row) {
  for (int64_t k = 0; k < p.K(); ++k) {
    const int level = p.level_of(codes[p.index(k, n)]);
    const double w = double(hd::load(p.dtype, p.w, p.index(k, n)));
    row.e[k] = w - p.dequantized(level, k, n);
    row.u[k] = w / double(p.scales[p.param(k, n)]) + double(p.zero(k, n));
    row.v0[k] = double(level) - row.u[k];
    row.v[k] = row.v0[k];
    row.best[k] = codes[p.index(k, n)];
  }
}

// r_k of row n from its e: s_k·Σ_j (e_j s_j) G_jk + damp·e_k, the sum in j order.
NIBBLE_HD inline double residual_at(const Problem& p, const double* e, int64_t k) {
  const int64_t K = p.K();
  double acc = 0;
  for (int64_t j = 0; j < K; ++j) acc += (e[j] * p.s[j]) * p.gram[j * K + k];
  return p.s[k] * acc + p.damp * e[k];
}

// residual_at for every k of the row, the same sums in the same order, walking G by rows (the host's way:
// residual_at walks a column, one thread per k on a device).
NIBBLE_HD inline void residual_row(const Problem& p, const Row& row) {
  const int64_t K = p.K();
  for (int64_t k = 0; k < K; ++k) row.r[k] = 0;
  for (int64_t j = 0; j < K; ++j) {
    const double a = row.e[j] * p.s[j];
    const double* g = p.gram + j * K;
    for (int64_t k = 0; k < K; ++k) row.r[k] += a * g[k];
  }
  for (int64_t k = 0; k < K; ++k) row.r[k] = p.s[k] * row.r[k] + p.damp * row.e[k];
}

NIBBLE_HD inline double objective(const Problem& p, const Row& row) {
  double l = 0;
  for (int64_t k = 0; k < p.K(); ++k) l += row.e[k] * row.r[k];
  return l;
}

// Moves weight k of row n to `level`: e, r and the objective l follow.
NIBBLE_HD inline void move_to(const Problem& p, int64_t n, int64_t k, int level, uint8_t* codes, const Row& row,
                              double& l) {
  const int64_t K = p.K();
  const double d = p.dequantized(level, k, n) - p.dequantized(p.level_of(codes[p.index(k, n)]), k, n);
  l += d * (d * p.h_diag(k) - 2.0 * row.r[k]);
  row.e[k] -= d;
  const double ds = d * p.s[k];
  for (int64_t j = 0; j < K; ++j) row.r[j] -= (ds * p.gram[k * K + j]) * p.s[j];
  row.r[k] -= p.damp * d;
  codes[p.index(k, n)] = p.code_of(level);
}

// AutoRound's sign steps from the given codes (r filled); best holds the codes of the lowest objective,
// which is returned.
NIBBLE_HD inline double row_descend(const Problem& p, int64_t n, uint8_t* codes, const Row& row) {
  const int64_t K = p.K();
  double l = objective(p, row), best = l;
  for (int t = 0; t < p.iters; ++t) {
    const double step = p.lr * (1.0 - double(t) / double(p.iters));
    for (int64_t k = 0; k < K; ++k) {
      if (!(p.h_diag(k) - p.damp > 0)) continue;  // a dead channel: nothing to learn
      const double g = row.r[k] * double(p.scales[p.param(k, n)]);
      if (g == 0) continue;
      const double lo = (row.v0[k] < 0 ? row.v0[k] : 0.0) - 0.5, hi = (row.v0[k] > 0 ? row.v0[k] : 0.0) + 0.5;
      double v = row.v[k] + (g > 0 ? step : -step);
      v = v < lo ? lo : (v > hi ? hi : v);
      row.v[k] = v;
      double level = hd::rint(float(row.u[k] + v));
      level = level < p.lowest() ? p.lowest() : (level > p.highest() ? p.highest() : level);
      if (int(level) != p.level_of(codes[p.index(k, n)])) move_to(p, n, k, int(level), codes, row, l);
    }
    if (l < best) {
      best = l;
      for (int64_t k = 0; k < K; ++k) row.best[k] = codes[p.index(k, n)];
    }
  }
  return best;
}

// The best codes back into `codes`; true when they differ from the last ones (e then follows, and r
// must be computed again).
NIBBLE_HD inline bool row_restore(const Problem& p, int64_t n, uint8_t* codes, const Row& row) {
  bool changed = false;
  for (int64_t k = 0; k < p.K(); ++k) {
    if (codes[p.index(k, n)] == row.best[k]) continue;
    changed = true;
    codes[p.index(k, n)] = row.best[k];
    const double w = double(hd::load(p.dtype, p.w, p.index(k, n)));
    row.e[k] = w - p.dequantized(p.level_of(row.best[k]), k, n);
  }
  return changed;
}

// The levels a weight may take: those around its unrounded level u (floor and ceil, AutoRound's range)
// and the given (GPTQ's) one, within the code range. Moving further fits the calibration tokens' own
// noise: unbounded sweeps lowered SmolLM2's calibration objective more and raised its perplexity.
NIBBLE_HD inline void neighbourhood(const Problem& p, double u, int given, int* lo, int* hi) {
  double fl = double(int64_t(u));
  if (fl > u) fl -= 1.0;
  const int f = int(fl), c = fl == u ? f : f + 1;
  *lo = given < f ? given : f;
  *hi = given > c ? given : c;
  if (*lo < p.lowest()) *lo = p.lowest();
  if (*hi > p.highest()) *hi = p.highest();
}

// Greedy sweeps (r filled): each weight moves one level up or down where that lowers the objective.
// Fills the row's statistics but `start`.
NIBBLE_HD inline void row_polish(const Problem& p, int64_t n, uint8_t* codes, const Row& row, const uint8_t* given,
                                 RowStats& st) {
  const int64_t K = p.K();
  double l = objective(p, row);
  for (int sweep = 0; sweep < p.polish_sweeps; ++sweep) {
    bool moved = false;
    for (int64_t k = 0; k < K; ++k) {
      if (!(p.h_diag(k) - p.damp > 0)) continue;
      const int cur = p.level_of(codes[p.index(k, n)]);
      int lo, hi;
      neighbourhood(p, row.u[k], p.level_of(given[p.index(k, n)]), &lo, &hi);
      for (int dl = -1; dl <= 1; dl += 2) {
        const int level = cur + dl;
        if (level < lo || level > hi) continue;
        const double d = p.dequantized(level, k, n) - p.dequantized(cur, k, n);
        if (d * (d * p.h_diag(k) - 2.0 * row.r[k]) < 0) {
          move_to(p, n, k, level, codes, row, l);
          moved = true;
          break;
        }
      }
    }
    if (!moved) break;
  }
  st.end = l;
  st.moved = 0;
  st.sq_error = 0;
  for (int64_t k = 0; k < K; ++k) {
    st.moved += codes[p.index(k, n)] != given[p.index(k, n)];
    const double w = double(hd::load(p.dtype, p.w, p.index(k, n)));
    const double d = w - p.dequantized(p.level_of(codes[p.index(k, n)]), k, n);
    st.sq_error += d * d;
  }
}

// Row n from the given codes to the learned ones, in the order the device's launches take (the residual
// of every k, then the descent, the restore and, where the codes changed, the residual again).
NIBBLE_HD inline RowStats learn_row(const Problem& p, int64_t n, uint8_t* codes, const uint8_t* given, const Row& row) {
  RowStats st;
  row_start(p, n, codes, row);
  residual_row(p, row);
  st.start = objective(p, row);
  row_descend(p, n, codes, row);
  if (row_restore(p, n, codes, row)) residual_row(p, row);
  row_polish(p, n, codes, row, given, st);
  return st;
}

}  // namespace nibble::kernels::learned

// The candidate search of rtn_lsq's symmetric fit, one source for the CPU reference
// (kernels/cpu/block_fit.h, on a gathered float array) and the CUDA backend's kernel body
// (kernels/cuda/search_kernels.h, on the block read in place); the CPU's vector kernels
// (kernels/cpu/rtn_lsq_fast_kernels.inc) compute the same operations lane by lane. NIBBLE_HD, IEEE
// arithmetic only, so every backend gives the same bits.
//
// A symmetric block's codes at inverse scale v / m (m its signed extreme) are l_k = clamp(rint(v·x_k / m)).
// Over the search's range of |v| (1.8 codes wide, as llama.cpp's make_qx_quants: ±9 steps of 0.1
// around the extreme's code -2^(b-1)) each |l_k| steps up at most twice, at grid positions that one look
// at the element gives. So every point of a fine grid of |v| (kGrid points) has its codes' sums
// B = Σ w·|x|·|l| and C = Σ w·l² from a comparison and a masked add per element and point, in
// registers, and so its exact weighted RTN error, Σ w·x² - 2·s·B + s²·C at the grid's scale s. A pass
// scores kPoints points: a coarse pass over the whole grid, then one fine pass around the best point:
// 2 passes per block. Only llama.cpp's orientation is searched (the extreme on the code -2^(b-1), the
// longer side); the other one (the extreme on +2^(b-1) - 1) cost a third of the search's time for 0.4%
// perplexity on SmolLM2 (bench/RESULTS.md).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/hd_float.h"

namespace nibble::kernels::lsq_grid {

constexpr int kGrid = 64;    // grid points: |v| = v0 + delta·i, i in [0, kGrid)
constexpr int kPoints = 8;   // points scored per pass over the block
constexpr int kCoarse = 9;   // the coarse pass's spacing: i = 0, 9, ..., 63
constexpr int kFine = 4;     // the fine pass: the coarse best's i ± 1 .. ± kFine
static_assert(kCoarse * (kPoints - 1) == kGrid - 1 && 2 * kFine == kPoints, "the passes cover the grid");

// What the search found: the best grid point's scale and the least-squares scale of its codes
// (Σ w·x·l / Σ w·l²), both signed as the block's scales are; found is false when no point has a
// nonzero code.
struct Pick {
  float grid_scale = 0;
  double lsq_scale = 0;
  bool found = false;
};

// The grid: the extreme on code -nmax, so the scale's sign is -m's.
struct Family {
  float v0, delta, inv_delta;
  float cap_same, cap_other;  // the largest code magnitude of an element of the extreme's sign / the other
};

NIBBLE_HD inline Family family(int bits, int steps) {
  const float nmax = float(1 << (bits - 1)), hi = nmax - 1.0f;
  const float step = 0.1f * nmax / 8.0f;  // llama.cpp's 0.1 of 8 levels, the same relative step at 8 bits
  Family f;
  f.v0 = nmax - step * float(steps);
  f.delta = 2.0f * step * float(steps) / float(kGrid - 1);
  f.inv_delta = 1.0f / f.delta;
  f.cap_same = nmax;
  f.cap_other = hi;
  return f;
}

// What one element adds: a = w·|x| to B and dc1 / dc2 to C where its code steps up from l0, at grid
// positions at1 / at2 (+inf where it does not: at the cap, or for x = 0).
struct Element {
  float a, c0, l0, at1, at2, dc1, dc2;  // c0 = w·l0²
};
NIBBLE_HD inline Element element(const Family& f, float x, float w, float amax, float inv, bool same_sign) {
  const float ax = hd::fabs(x), r = ax * inv, q = amax / ax;
  const float cap = same_sign ? f.cap_same : f.cap_other;
  const float near = hd::rint(f.v0 * r);
  Element e;
  e.a = w * ax;
  e.l0 = near < cap ? near : cap;  // hd::min(cap, near)
  e.c0 = w * e.l0 * e.l0;
  const float j2 = e.l0 + 1.0f;
  const float t1 = ((e.l0 + 0.5f) * q - f.v0) * f.inv_delta, t2 = ((j2 + 0.5f) * q - f.v0) * f.inv_delta;
  e.at1 = e.l0 < cap ? t1 : INFINITY;
  e.at2 = j2 < cap ? t2 : INFINITY;
  e.dc1 = w * (2.0f * e.l0 + 1.0f);
  e.dc2 = w * (2.0f * j2 + 1.0f);
  return e;
}

// The best so far, over the points (scores leave out Σ w·x², the same for every point), and its grid
// position.
struct Best {
  Pick pick;
  double score = 0;
  float at = 0;
  NIBBLE_HD bool take(double s) const { return !pick.found || s < score; }
};

// One pass: the sums of kPoints grid points pt[] (in element order; the codes' sums at v0 added
// after), each point scored into `best` in order.
template <class X, class W>
NIBBLE_HD void score_pass(const X& x, const W& w, int n, const Family& f, float m, float amax, float sign,
                          const float* pt, Best& best) {
  const float inv = 1.0f / amax;
  float b = 0, c = 0, B[kPoints] = {}, C[kPoints] = {};
  for (int k = 0; k < n; ++k) {
    const float v = x[k];
    const Element e = element(f, v, w[k], amax, inv, (v < 0.0f) == (m < 0.0f));
    b += e.a * e.l0;
    c += e.c0;
    for (int p = 0; p < kPoints; ++p)
      if (e.at1 <= pt[p]) B[p] += e.a, C[p] += e.dc1;
  }
  for (int p = 0; p < kPoints; ++p) B[p] = b + B[p], C[p] = c + C[p];
  // The second steps after the first, summed in their own pass over the block: only elements near the
  // extreme step twice on the grid (at 4 bits, |x| above about 0.83 of it), so a vector kernel adds them
  // for the few elements where one of its lanes does.
  for (int k = 0; k < n; ++k) {
    const float v = x[k];
    const Element e = element(f, v, w[k], amax, inv, (v < 0.0f) == (m < 0.0f));
    for (int p = 0; p < kPoints; ++p)
      if (e.at2 <= pt[p]) B[p] += e.a, C[p] += e.dc2;
  }
  for (int p = 0; p < kPoints; ++p) {
    const float bb = B[p], cc = C[p];
    if (!(cc > 0.0f)) continue;
    const float s = amax / (f.v0 + f.delta * pt[p]);
    const double score = double(s) * (double(s) * double(cc) - 2.0 * double(bb));
    if (best.take(score)) {
      best.score = score, best.pick.found = true, best.at = pt[p];
      best.pick.grid_scale = sign * s;
      best.pick.lsq_scale = double(sign) * (double(bb) / double(cc));
    }
  }
}

// The search. `x` and `w` are the block and its importances (anything with [k] -> float); m is the
// signed extreme and amax = |m| > 0, finite.
template <class X, class W>
NIBBLE_HD Pick search(const X& x, const W& w, int n, float m, float amax, int bits, int steps) {
  const Family f = family(bits, steps);
  const float sign = m < 0.0f ? 1.0f : -1.0f;
  float pt[kPoints];
  for (int p = 0; p < kPoints; ++p) pt[p] = float(kCoarse * p);
  Best best;
  score_pass(x, w, n, f, m, amax, sign, pt, best);
  if (!best.pick.found) return best.pick;
  for (int p = 0; p < kPoints; ++p) {
    const float off = float(p < kFine ? p - kFine : p - kFine + 1);  // -4 .. -1, 1 .. 4
    pt[p] = hd::min(hd::max(best.at + off, 0.0f), float(kGrid - 1));
  }
  score_pass(x, w, n, f, m, amax, sign, pt, best);
  return best.pick;
}

}  // namespace nibble::kernels::lsq_grid

"""Independent numpy reference of nibble's calibration-free per-block searches, written from the
algorithms (llama.cpp's make_qx_quants / make_qkx2_quants; HQQ, Badri & Shaji 2023, as ONNX Runtime's
HQQWeightOnlyQuantizer.optimize_weights runs it) with nibble's choices spelled out, float32 weights,
K a multiple of the block, all blocks at once ([blocks, bs] rows):

  importance of each element: w = rms(block) + |x|  (llama.cpp's k-quant weighting)
  rtn_lsq, symmetric:
      m = the block's signed extreme (first largest |x|);  start s0 = m / -8, best = s0
      candidates: the extreme on code -8 (llama.cpp's orientation), a grid of 64 inverse scales
        v_i / m, |v_i| from 8 - 0.9 to 8 + 0.9; a grid point's codes are clip(rint(v_i/m · x))
        and its rank the exact error Σ w·(x - s_i·l)² at s_i = m / v_i. Scored: the 8 points
        0, 9, .., 63, then the best of those ± 1..4; the best point gives the candidate, the
        least-squares fit of its codes Σ w·x·l / Σ w·l², kept where it lowers
        the error Σ w·(x - s·l)² (float32, in element order)
  hqq: is = min(15 / (mx - mn), 2e4), z = rint(-mn · is), β = 10; up to 20 times:
      q = clip(rint(x·is + z), 0, 15); r = x - (q - z) / is; e = sign(r)·relu(|r| - |r + 1e-8|^(p-1) / β)
      (p = 0.7); z = mean(q - (x - e)·is); β *= 1.01; stop when mean |r| stops falling
      then s = 1 / is, z = clip(rint(z), 0, 15), codes clip(rint(x / s) + z, 0, 15)
  hqq with float zero points (MatMulNBits): the block's own [min, max] (0 need not be in it), the same
      iterations, z = the iterate with the smallest mean |r| (not the update after it); s = 1 / is and z
      rounded to the model's float type T; codes clip(rint(x / s + z), 0, 15) in float32 from those
      rounded values; the weight is (codes - z) · s

The grid's sums are float32 in element order and its ranks float64 (as nibble computes them, so its
choices are nibble's bit for bit); the other sums are numpy's (pairwise), nibble's sequential in float64, and nibble's power is its own
(kernels/hd_pow.h: computed in double and rounded to float once, the same bits on the CPU and on a GPU),
not numpy's float32 power: a near-tie may go the other way in a rare block, which the test bounds.
"""
from __future__ import annotations

import numpy as np

f32 = np.float32


def blocks_of(w: np.ndarray, bs: int) -> np.ndarray:
    """w [K, N] -> rows [N * G, bs] (column n's block g at row n * G + g)."""
    K, N = w.shape
    assert K % bs == 0 and w.dtype == np.float32
    return np.ascontiguousarray(w.T.reshape(N * (K // bs), bs))


def _sq_err(x, codes, s, z=None, imp=None):
    deq = ((codes.astype(f32) - (0 if z is None else z[:, None].astype(f32))) * s[:, None]).astype(f32)
    d = (x - deq).astype(np.float64)
    return ((1.0 if imp is None else imp) * d * d).sum(axis=1)


def _code_err(x, codes, s, w):
    """The symmetric finalists' rank: float32 w·(d·d) summed in element order (nibble's fit::code_error)."""
    d = (x - (codes.astype(f32) * s[:, None]).astype(f32)).astype(f32)
    return np.add.accumulate((w * (d * d)).astype(f32), axis=1, dtype=f32)[:, -1]


def importance(x: np.ndarray):
    """(float64 importance for the error, float32 for the sums), per element of x [B, bs]."""
    xd = x.astype(np.float64)
    rms = np.sqrt((xd * xd).sum(axis=1) / x.shape[1])
    imp = rms[:, None] + np.abs(xd)
    return imp, (rms.astype(f32)[:, None] + np.abs(x)).astype(f32)


def _rtn_sym(x, s):
    return np.clip(np.rint((x / s[:, None]).astype(f32)), -8, 7)


def _rtn_zp(x, s, z):
    return np.clip(np.rint((x / s[:, None]).astype(f32)) + z[:, None], 0, 15)


def _grid_pick(x, w, m, steps=9):
    """The grid search: per block (grid scale, least-squares scale of its codes), NaN where none."""
    B_, n = x.shape
    amax = np.abs(m).astype(f32)
    inv = (f32(1) / amax).astype(f32)
    best_score = np.full(B_, np.inf)
    pick_s, pick_l = np.full(B_, np.nan, dtype=f32), np.full(B_, np.nan)
    step = f32(f32(f32(0.1) * f32(8)) / f32(8))
    best_at = np.zeros(B_, dtype=f32)
    v0 = f32(f32(8) - f32(step * f32(steps)))
    delta = f32(f32(f32(f32(2) * step) * f32(steps)) / f32(63))
    inv_delta = f32(f32(1) / delta)
    same = (x < 0) == (m < 0)[:, None]
    cap = np.where(same, f32(8), f32(7)).astype(f32)
    sign = np.where(m < 0, f32(1), f32(-1)).astype(f32)
    ax = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (ax * inv[:, None]).astype(f32)
        q = (amax[:, None] / ax).astype(f32)
        near = np.rint((v0 * r).astype(f32)).astype(f32)
        l0 = np.where(near < cap, near, cap).astype(f32)
        j2 = (l0 + f32(1)).astype(f32)
        t1 = (((l0 + f32(0.5)).astype(f32) * q - v0).astype(f32) * inv_delta).astype(f32)
        t2 = (((j2 + f32(0.5)).astype(f32) * q - v0).astype(f32) * inv_delta).astype(f32)
    at1 = np.where(l0 < cap, t1, np.inf).astype(f32)
    at2 = np.where(j2 < cap, t2, np.inf).astype(f32)
    a = (w * ax).astype(f32)
    c0 = ((w * l0).astype(f32) * l0).astype(f32)
    dc1 = (w * (f32(2) * l0 + f32(1)).astype(f32)).astype(f32)
    dc2 = (w * (f32(2) * j2 + f32(1)).astype(f32)).astype(f32)
    b, c = np.zeros(B_, dtype=f32), np.zeros(B_, dtype=f32)
    for k in range(n):
        b = (b + (a[:, k] * l0[:, k]).astype(f32)).astype(f32)
        c = (c + c0[:, k]).astype(f32)
    grid = dict(v0=v0, delta=delta, sign=sign, at1=at1, at2=at2, a=a, dc1=dc1, dc2=dc2, b=b, c=c)

    def score_pass(g, pt):  # g: the grid's arrays; pt [B, 8] float32 grid positions
        Bp, Cp = np.zeros((B_, 8), dtype=f32), np.zeros((B_, 8), dtype=f32)
        for k in range(n):  # the first steps, then (on top of the sums at v0) the second ones
            m1 = g["at1"][:, k:k + 1] <= pt
            Bp = np.where(m1, Bp + g["a"][:, k:k + 1], Bp).astype(f32)
            Cp = np.where(m1, Cp + g["dc1"][:, k:k + 1], Cp).astype(f32)
        Bp, Cp = (g["b"][:, None] + Bp).astype(f32), (g["c"][:, None] + Cp).astype(f32)
        for k in range(n):
            m2 = g["at2"][:, k:k + 1] <= pt
            Bp = np.where(m2, Bp + g["a"][:, k:k + 1], Bp).astype(f32)
            Cp = np.where(m2, Cp + g["dc2"][:, k:k + 1], Cp).astype(f32)
        for p in range(8):
            bb, cc = Bp[:, p], Cp[:, p]
            s = (amax / (g["v0"] + (g["delta"] * pt[:, p]).astype(f32)).astype(f32)).astype(f32)
            sd = s.astype(np.float64)
            score = sd * (sd * cc.astype(np.float64) - 2.0 * bb.astype(np.float64))
            has = cc > 0
            take = has & ((best_score == np.inf) | (score < best_score))
            best_score[:] = np.where(take, score, best_score)
            best_at[:] = np.where(take, pt[:, p], best_at)
            pick_s[:] = np.where(take, (g["sign"] * s).astype(f32), pick_s)
            with np.errstate(divide="ignore", invalid="ignore"):
                lsq = g["sign"].astype(np.float64) * (bb.astype(np.float64) / cc.astype(np.float64))
            pick_l[:] = np.where(take, lsq, pick_l)

    coarse = np.tile(np.arange(0, 64, 9, dtype=f32), (B_, 1))
    score_pass(grid, coarse)
    offs = np.array([-4, -3, -2, -1, 1, 2, 3, 4], dtype=f32)
    score_pass(grid, np.clip(best_at[:, None] + offs, f32(0), f32(63)).astype(f32))
    return pick_s, pick_l


def lsq_symmetric(x: np.ndarray, steps: int = 9):
    """x [B, bs] float32 -> (scale [B], codes [B, bs] int8)."""
    rows = np.arange(x.shape[0])
    m = x[rows, np.abs(x).argmax(axis=1)]
    _, w = importance(x)
    usable = lambda s: np.abs(s) >= f32(1e-5)  # noqa: E731
    err = lambda s: np.where(usable(s), _code_err(x, _rtn_sym(x, np.where(usable(s), s, 1)), s, w), np.inf)  # noqa: E731
    best = (m / f32(-8)).astype(f32)
    _, grid_l = _grid_pick(x, w, m, steps)
    found = ~np.isnan(grid_l)
    cand = np.where(found, grid_l, 0).astype(f32)
    take = found & (err(cand) < err(best))
    best = np.where(take, cand, best)
    return best, _rtn_sym(x, best).astype(np.int8)


def _hqq_z(v, mn, mx, lp_norm, beta, kappa, iters, keep_best):
    """The proximal iterations of one block: (is, z)."""
    n = v.size
    is_ = f32(min(f32(f32(15) / f32(mx - mn)), f32(2e4)))
    z, bt, best = f32(np.rint(f32(-mn * is_))), f32(beta), f32(1e4)
    z_best = z
    for _ in range(iters):
        q = np.clip(np.rint((v * is_ + z).astype(f32)), 0, 15).astype(f32)
        r = (v - ((q - z) / is_).astype(f32)).astype(f32)
        ar = np.abs(r)
        shr = np.maximum(ar - (f32(1) / bt) * np.power(ar + f32(1e-8), f32(f32(lp_norm) - f32(1))).astype(f32), f32(0))
        e = np.copysign(shr, r).astype(f32)
        z_next = f32((q - (v - e) * is_).astype(f32).astype(np.float64).sum() / n)
        bt = f32(bt * f32(kappa))
        err = f32(ar.astype(np.float64).sum() / n)
        if err < best:
            best, z_best, z = err, z, z_next
        else:
            z = z_next
            break
    return is_, (z_best if keep_best else z)


def hqq_float(x: np.ndarray, dtype=np.float32, lp_norm: float = 0.7, beta: float = 10.0, kappa: float = 1.01,
              iters: int = 20):
    """x [B, bs] float32 (values of a `dtype` weight) -> (scale [B], zero point [B], codes [B, bs] uint8);
    scale and zero point hold `dtype` values (as float32)."""
    B = x.shape[0]
    scale, zero = np.zeros(B, f32), np.zeros(B, f32)
    tiny = f32(dtype(1e-5))
    for b in range(B):
        v = x[b]
        mn, mx = f32(v.min()), f32(v.max())
        assert mx > mn, "constant blocks are not modelled"
        is_, z = _hqq_z(v, mn, mx, lp_norm, beta, kappa, iters, True)
        scale[b] = max(f32(dtype(f32(1) / is_)), tiny)
        zero[b] = f32(dtype(z))
    codes = np.clip(np.rint((x / scale[:, None] + zero[:, None]).astype(f32)), 0, 15).astype(np.uint8)
    return scale, zero, codes


def hqq(x: np.ndarray, lp_norm: float = 0.7, beta: float = 10.0, kappa: float = 1.01, iters: int = 20):
    """x [B, bs] float32 -> (scale [B], zero point [B], codes [B, bs] uint8); one block at a time in
    float32 (each block stops on its own)."""
    B, n = x.shape
    scale = np.zeros(B, f32)
    zps = np.zeros(B, np.uint8)
    for b in range(B):
        v = x[b]
        mn, mx = f32(min(v.min(), 0)), f32(max(v.max(), 0))
        if not mx > mn:
            scale[b], zps[b] = f32(1e-5), 0
            continue
        is_, z = _hqq_z(v, mn, mx, lp_norm, beta, kappa, iters, False)
        scale[b] = max(f32(f32(1) / is_), f32(1e-5))
        zps[b] = np.uint8(np.clip(np.rint(z), 0, 15))
    codes = _rtn_zp(x, scale, zps.astype(f32)).astype(np.uint8)
    return scale, zps, codes


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (v - trunc(v) is exact in float32)."""
    t = np.trunc(v)
    return (t + np.where(np.abs(v - t) >= f32(0.5), np.sign(v), f32(0))).astype(v.dtype)


def ort_zero_point(x: np.ndarray, dtype=np.float32):
    """ONNX Runtime's asymmetric 4-bit RTN of rows x (MLAS's blockwise quantizer, written from its
    source): range [min(x, 0), max(x, 0)], scale (max - min) / 15 in float32 stored as `dtype`, zero
    point roundf(-min / scale) from the unrounded scale, codes roundf(x * (1 / s) + z) from the stored
    scale s. An all-zero block gets 1e-5 (nibble's departure: MLAS stores 0; the codes are the same).
    Returns (scale as float32, zero point, codes)."""
    mn = np.minimum(x.min(axis=1), f32(0))
    mx = np.maximum(x.max(axis=1), f32(0))
    sf = ((mx - mn) / f32(15)).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        zf = np.where(sf != 0, f32(0) - mn / sf, mn).astype(f32)
    z = np.clip(round_half_away(zf), 0, 15).astype(np.uint8)
    s = np.where(sf != 0, sf.astype(dtype).astype(f32), f32(np.float32(1e-5).astype(dtype)))
    rs = np.where(sf != 0, f32(1) / s, f32(0)).astype(f32)
    q = (x * rs[:, None]).astype(f32) + z[:, None].astype(f32)
    codes = np.clip(round_half_away(q.astype(f32)), 0, 15).astype(np.uint8)
    return s.astype(f32), z, codes


def ort_symmetric(x: np.ndarray, dtype=np.float32, bits: int = 4):
    """ONNX Runtime's symmetric RTN of rows x (MLAS's blockwise quantizer, written from its source): the
    block's extreme e, the value of larger magnitude of its min and max (the min on a tie), scale -e / 2^(b-1)
    in float32 stored as `dtype`, so that e lands on the code -2^(b-1); codes roundf(x * (1 / s) + 2^(b-1)),
    clamped to [0, 2^b - 1], less 2^(b-1). An all-zero block gets 1e-5 (nibble's departure: MLAS stores 0;
    the codes are the same). Returns (scale as float32, signed codes)."""
    half = f32(1 << (bits - 1))
    mn, mx = x.min(axis=1), x.max(axis=1)
    e = np.where(np.abs(mx) > np.abs(mn), mx, mn).astype(f32)
    sf = (-e / half).astype(f32)
    s = np.where(sf != 0, sf.astype(dtype).astype(f32), f32(np.float32(1e-5).astype(dtype)))
    with np.errstate(divide="ignore"):
        rs = np.where(s != 0, f32(1) / s, f32(0)).astype(f32)
    q = (x * rs[:, None]).astype(f32) + half
    codes = np.clip(round_half_away(q.astype(f32)), 0, 2 * half - 1) - half
    return s.astype(f32), codes.astype(np.int8)

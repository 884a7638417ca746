"""Independent numpy reference of nibble's calibration-free per-block searches, written from the
algorithms (llama.cpp's make_qx_quants / make_qkx2_quants; HQQ, Badri & Shaji 2023, as ONNX Runtime's
HQQWeightOnlyQuantizer.optimize_weights runs it) with nibble's choices spelled out, float32 weights,
K a multiple of the block, all blocks at once ([blocks, bs] rows):

  importance of each element: w = rms(block) + |x|  (llama.cpp's k-quant weighting)
  rtn_lsq, symmetric:
      m = the block's signed extreme (first largest |x|);  start s0 = m / -8
      for i in -9..9: l = clip(rint(-(8 + 0.1 i) / m · x), -8, 7);  fit = (Σ w·x·l)² / Σ w·l²  (largest
        wins, first on ties);  s1 = Σ w·x·l / Σ w·l²  (float32)
      codes = clip(rint(x / s), -8, 7) for s in {s0, s1}; keep s1 if its Σ w·(x - code·s)² is smaller
  hqq: is = min(15 / (mx - mn), 2e4), z = rint(-mn · is), β = 10; up to 20 times:
      q = clip(rint(x·is + z), 0, 15); r = x - (q - z) / is; e = sign(r)·relu(|r| - |r + 1e-8|^(p-1) / β)
      (p = 0.7); z = mean(q - (x - e)·is); β *= 1.01; stop when mean |r| stops falling
      then s = 1 / is, z = clip(rint(z), 0, 15), codes clip(rint(x / s) + z, 0, 15)
  hqq with float zero points (MatMulNBits): the block's own [min, max] (0 need not be in it), the same
      iterations, z = the iterate with the smallest mean |r| (not the update after it); s = 1 / is and z
      rounded to the model's float type T; codes clip(rint(x / s + z), 0, 15) in float32 from those
      rounded values; the weight is (codes - z) · s

Sums are numpy's (pairwise), nibble's sequential in float64, and numpy's float32 power is not libm's
powf: a near-tie may go the other way in a rare block, which the test bounds.
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


def importance(x: np.ndarray):
    """(float64 importance for the error, float32 for the sums), per element of x [B, bs]."""
    xd = x.astype(np.float64)
    rms = np.sqrt((xd * xd).sum(axis=1) / x.shape[1])
    imp = rms[:, None] + np.abs(xd)
    return imp, imp.astype(f32)


def _rtn_sym(x, s):
    return np.clip(np.rint((x / s[:, None]).astype(f32)), -8, 7)


def _rtn_zp(x, s, z):
    return np.clip(np.rint((x / s[:, None]).astype(f32)) + z[:, None], 0, 15)


def lsq_symmetric(x: np.ndarray, steps: int = 9):
    """x [B, bs] float32 -> (scale [B], codes [B, bs] int8)."""
    rows = np.arange(x.shape[0])
    m = x[rows, np.abs(x).argmax(axis=1)]
    s0 = (m / f32(-8)).astype(f32)
    imp, w = importance(x)
    best_fit = np.zeros(x.shape[0])
    fit_s = np.zeros(x.shape[0])
    step = f32(f32(0.1) * f32(8)) / f32(8)
    for i in range(-steps, steps + 1):
        iscale = (-(f32(8) + step * f32(i)) / m).astype(f32)
        l = np.clip(np.rint((iscale[:, None] * x).astype(f32)), -8, 7).astype(f32)
        sxl = (w * x * l).astype(np.float64).sum(axis=1)
        sll = (w * l * l).astype(np.float64).sum(axis=1)
        better = (sll > 0) & (sxl * sxl > best_fit * sll)
        safe = np.where(sll > 0, sll, 1)
        best_fit = np.where(better, sxl * sxl / safe, best_fit)
        fit_s = np.where(better, sxl / safe, fit_s)
    s1 = fit_s.astype(f32)
    c0, c1 = _rtn_sym(x, s0), _rtn_sym(x, np.where(s1 == 0, 1, s1))
    take = (np.abs(s1) >= f32(1e-5)) & (_sq_err(x, c1, s1, imp=imp) < _sq_err(x, c0, s0, imp=imp))
    return np.where(take, s1, s0), np.where(take[:, None], c1, c0).astype(np.int8)


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
        is_ = f32(min(f32(f32(15) / f32(mx - mn)), f32(2e4)))
        z, bt, best = f32(np.rint(f32(-mn * is_))), f32(beta), f32(1e4)
        for _ in range(iters):
            q = np.clip(np.rint((v * is_ + z).astype(f32)), 0, 15).astype(f32)
            r = (v - ((q - z) / is_).astype(f32)).astype(f32)
            ar = np.abs(r)
            shr = np.maximum(ar - (f32(1) / bt) * np.power(ar + f32(1e-8), f32(f32(lp_norm) - f32(1))).astype(f32), f32(0))
            e = np.copysign(shr, r).astype(f32)
            z = f32((q - (v - e) * is_).astype(f32).astype(np.float64).sum() / n)
            bt = f32(bt * f32(kappa))
            err = f32(ar.astype(np.float64).sum() / n)
            if err < best:
                best = err
            else:
                break
        scale[b] = max(f32(f32(1) / is_), f32(1e-5))
        zps[b] = np.uint8(np.clip(np.rint(z), 0, 15))
    codes = _rtn_zp(x, scale, zps.astype(f32)).astype(np.uint8)
    return scale, zps, codes

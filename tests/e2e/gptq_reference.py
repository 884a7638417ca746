"""Independent numpy reference of nibble's GPTQ (float64, no lazy batches), written from the algorithm
(Frantar et al. 2022, AutoGPTQ's gptq.py) with nibble's choices spelled out:

  H      = diag(inv_s) XᵀX diag(inv_s)  (inv_s: 1, or 1/s of awq_gptq);  dead = diag(H) == 0: H[d, :] =
           H[:, d] = 0, H[d, d] = 1, W[d, :] = 0
  perm   = identity, or (act order) channels by decreasing diag(H), stable
  damp   = percdamp * mean(diag H);  U = cholesky(inv(H[perm][:, perm] + damp I)).T   (H⁻¹ = UᵀU)
  sweep  for i in 0..K-1 (channel k = perm[i], block g = k // bs):
           if block g has no scale yet: for each column, the candidate among ratios r (and, symmetric,
             -scale too) with the smallest Σ_t diag(H)[t] (v_t - ŵ_t)² over the block's CURRENT values v
             (first on ties); symmetric s = max(r·amax / 7, 1e-5), zero point s = max(r·mx - r·mn,
             1e-5) / 15, z = clip(-rint(r·mn / s), 0, 15) ([mn, mx] with 0 for a partial block), all
             float32 as nibble rounds them
           q = codes of row i;  e = (w_i - ŵ_i) / U[i, i];  rows j > i: w_j -= U[i, j] e
"""
from __future__ import annotations

import numpy as np

RATIOS = [1.0, 0.975, 0.95, 0.925, 0.9, 0.875, 0.85, 0.825, 0.8, 0.775, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5]


def _candidates(v: np.ndarray, partial: bool, zero_point: bool, ratios, both_signs: bool):
    """(scale, zero point) candidates for a block v [len], float32 arithmetic as nibble's kernel."""
    f32 = np.float32
    amax = f32(np.abs(v).max())
    mn, mx = f32(v.min()), f32(v.max())
    if partial:
        mn, mx = min(mn, f32(0)), max(mx, f32(0))
    out = []
    for r in ratios:
        r = f32(r)
        if zero_point:
            lo, hi = f32(r * mn), f32(r * mx)
            s = f32(max(f32(hi - lo), f32(1e-5)) / f32(15))
            z = int(np.clip(-np.rint(f32(lo / s)), 0, 15))
            out.append((s, z))
        else:
            out.append((f32(max(f32(f32(r * amax) / f32(7)), f32(1e-5))), 0))
    if not zero_point and both_signs:
        out += [(-s, 0) for s, _ in out]
    return out


def _codes(v: np.ndarray, s: np.float32, z: int, zero_point: bool) -> np.ndarray:
    r = np.rint(v.astype(np.float32) / s)
    return np.clip(r + z, 0, 15) if zero_point else np.clip(r, -8, 7)


def _deq(c: np.ndarray, s: np.float32, z: int) -> np.ndarray:
    return ((c - z).astype(np.float32) * s).astype(np.float64)


def gptq(w: np.ndarray, gram: np.ndarray, bs: int, zero_point: bool = False, act_order: bool = False,
         percdamp: float = 0.01, inv_s: np.ndarray | None = None, ratios=RATIOS, both_signs: bool = True):
    """W [K, N] -> (codes [K, N] int, scales [G, N] float32, zero points [G, N] int or None)."""
    K, N = w.shape
    G = -(-K // bs)
    inv_s = np.ones(K) if inv_s is None else inv_s.astype(np.float64)
    H = gram.astype(np.float64) * inv_s[:, None] * inv_s[None, :]
    energy = np.diag(H).copy()
    dead = ~(energy > 0)
    H[dead, :] = 0
    H[:, dead] = 0
    H[dead, dead] = 1
    W = w.astype(np.float64).copy()
    W[dead, :] = 0
    perm = np.argsort(-energy, kind="stable") if act_order else np.arange(K)   # decreasing, ties by index
    Hp = H[np.ix_(perm, perm)]
    Hp = Hp + percdamp * np.mean(np.diag(Hp)) * np.eye(K)
    U = np.linalg.cholesky(np.linalg.inv(Hp)).T
    Wp = W[perm].copy()
    pos = np.empty(K, np.int64)
    pos[perm] = np.arange(K)
    codes = np.zeros((K, N), np.int64)
    scales = np.zeros((G, N), np.float32)
    zps = np.zeros((G, N), np.int64)
    fixed = np.zeros(G, bool)
    energy32 = energy.astype(np.float32).astype(np.float64)
    for i in range(K):
        k = perm[i]
        g = k // bs
        k0, k1 = g * bs, min(K, g * bs + bs)
        if not fixed[g]:
            vals = Wp[pos[k0:k1]].astype(np.float32)             # [len, N], the block's current values
            for n in range(N):
                v = vals[:, n]
                best, best_err = None, np.inf
                for s, z in _candidates(v, k1 - k0 < bs, zero_point, ratios, both_signs):
                    d = v.astype(np.float64) - _deq(_codes(v, s, z, zero_point), s, z)
                    err = float(np.sum(energy32[k0:k1] * d * d))
                    if err < best_err:
                        best, best_err = (s, z), err
                if best is None:
                    best = _candidates(v, k1 - k0 < bs, zero_point, ratios[:1], False)[0]
                scales[g, n], zps[g, n] = best
            fixed[g] = True
        c = _codes(Wp[i].astype(np.float32), scales[g], zps[g], zero_point)
        deq = ((c - zps[g]).astype(np.float32) * scales[g]).astype(np.float64)
        codes[k] = c
        e = (Wp[i] - deq) / U[i, i]
        Wp[i + 1:] -= np.outer(U[i, i + 1:], e)
    return codes, scales, (zps if zero_point else None)


def output_error(w: np.ndarray, deq: np.ndarray, gram: np.ndarray) -> float:
    """tr(Dᵀ XᵀX D), D = W - Ŵ: the squared output error summed over the calibration tokens."""
    d = w.astype(np.float64) - deq.astype(np.float64)
    return float(np.einsum("kn,kj,jn->", d, gram, d))

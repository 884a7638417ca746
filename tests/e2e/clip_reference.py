"""Independent numpy reference of ModelOpt's awq_clip and awq_full (reference doc §6), written from
the doc, in ModelOpt's float32 numpy arithmetic (the order of its reductions included, so the chosen
ratios are exact, not merely close).

awq_clip, per quantizable MatMul (graph order), W [K, N] float32, block bs:

  X        = concat over the calibration samples of the float model's activation, reshaped [-1, K]
             (padding rows included), then X[0::max(1, T // 64)]              (64..127 rows)
  ratios   = [round(r, 2) for r in np.arange(0.5, 1.0, 0.05)] + [1.0]
  W, X zero-padded on K to G*bs; P[n, t, g] = sum_i X[t, g*bs+i] * W[g*bs+i, n]   (np.sum, last axis)
  for r in ratios:   Wr = deq(quant_sym(W, bs, alpha=r));  L_r[n, g] = mean_t (P_ref - P_r)^2
  best[n, g] = the first r whose loss is strictly smaller than every earlier one (1.0 if none)
  final:   s[g, n] = max((amax[g, n] * best[n, g]) / 7, 1e-5), q = clip(rint(W / s), -8, 7)

awq_full (fuse on): each node's own AWQ-lite scale s* (awq_reference, fuse off), the clip search above
on W * s*[:, None] against the UNSCALED X, and the final weight quant_sym(W' * s[:, None], ratios) with
s = the siblings' mean scale and W' = W (or W / s_c where a consumer's 1/s is folded into W's columns,
as nibble does).  With a zero point the ratios have no effect: the final weight is awq_lite's.
fp32 models only.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from . import awq_reference as ar
from .reference import Quantized

MAX_TOKENS = 64


def clip_ratios(step: float = 0.05, alpha_min: float = 0.5) -> list[float]:
    return [round(float(k), 2) for k in np.arange(alpha_min, 1.0, step)] + [1.0]


def _pad_k(a: np.ndarray, bs: int, axis: int) -> np.ndarray:
    pad = (-a.shape[axis]) % bs
    if not pad:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, pad)
    return np.pad(a, widths)


def quant_sym(w: np.ndarray, bs: int, alpha) -> tuple[np.ndarray, np.ndarray]:
    """(codes [K, N] int8, scales [G, N] float32) of W [K, N]; alpha a float or float32 [N * G] (n-major)."""
    K, N = w.shape
    wp = _pad_k(w, bs, 0)
    G = wp.shape[0] // bs
    amax = np.abs(wp.T.reshape(-1, bs)).max(axis=-1)          # [N * G], n-major
    s = np.clip((amax * alpha) / 7, 1e-5, None).reshape(N, G).T  # [G, N]
    q = np.clip(np.rint(wp / s.repeat(bs, axis=0)), -8, 7).astype(np.int8)[:K]
    return q, s


def sample_rows(x: np.ndarray, K: int, max_tokens: int = MAX_TOKENS) -> np.ndarray:
    x = x.reshape(-1, K)
    return x[0::max(1, x.shape[0] // max_tokens)]


def clip_search(x: np.ndarray, w: np.ndarray, bs: int, ratios: list[float], bsz_col: int = 1024) -> tuple[np.ndarray, dict]:
    """best ratio per block, float32 [N * G] (n-major), and the losses {r: [N, G]}."""
    K, N = w.shape
    xs = sample_rows(x, K)
    wp, xp = _pad_k(w, bs, 0), _pad_k(xs, bs, 1)
    G = wp.shape[0] // bs
    w4 = wp.T.reshape(N, 1, G, bs)
    x4 = xp.reshape(1, xp.shape[0], G, bs)
    # ModelOpt's arrays as ModelOpt lays them out (w4 and dq are transposed views: numpy's
    # reductions then run element after element), in its chunks of 1024 output columns
    losses = {r: np.zeros((N, G), np.float32) for r in ratios}
    for c0 in range(0, N, bsz_col):
        c1 = min(N, c0 + bsz_col)
        ref = np.sum(x4 * w4[c0:c1], axis=-1)                   # [n, T, G]
        for r in ratios:
            q, s = quant_sym(wp, bs, r)
            dq = (q * s.repeat(bs, axis=0)).T.reshape(N, 1, G, bs)[c0:c1]
            cur = np.sum(x4 * dq, axis=-1)
            losses[r][c0:c1] += np.mean(np.power(ref - cur, 2), axis=1)    # [n, G]
    best_loss = np.full(N * G, np.inf, np.float32)
    best = np.ones(N * G, np.float32)
    for r, l in losses.items():
        l = l.reshape(-1)
        better = l < best_loss
        best_loss = np.where(better, l, best_loss)
        best = np.where(better, r, best)
    return best.astype(np.float32), losses


@dataclasses.dataclass
class ClipWeight:
    name: str
    node: str
    act: str
    ratios: np.ndarray        # [N * G]
    quant: Quantized


def planned(model: onnx.ModelProto, exclude=("/lm_head",)):
    """(node, weight, activation) of every quantizable MatMul, graph order (as awq_reference)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type != "MatMul" or ar._node_names_excluded(n.name, list(exclude)):
            continue
        if len(n.input) < 2 or n.input[0] in inits or n.input[1] not in inits:
            continue
        out.append((n, n.input[1], n.input[0]))
    return out


def _quantized(q, s, bs, K, N) -> Quantized:
    return Quantized(q, s.astype(np.float32), None, bs, K, N)


def awq_clip(model: onnx.ModelProto, samples: list[dict], block_size: int = 128) -> dict[str, ClipWeight]:
    arr = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    plan = planned(model)
    X = ar.capture(model, list(dict.fromkeys(a for _, _, a in plan)), samples)
    ratios = clip_ratios()
    out = {}
    for n, wname, a in plan:
        w = arr[wname]
        K, N = w.shape
        bs = K if block_size == -1 else block_size
        best, _ = clip_search(np.concatenate(X[a], axis=0), w, bs, ratios)
        q, s = quant_sym(w, bs, best)
        out[wname] = ClipWeight(wname, n.name, a, best, _quantized(q, s, block_size, K, N))
    return out


def awq_full(model: onnx.ModelProto, samples: list[dict], block_size: int = 128,
             zero_point: bool = False) -> tuple[dict[str, ClipWeight], ar.AwqResult]:
    """ModelOpt's awq_full with fuse on; returns the weights and the awq_lite result (placement)."""
    arr = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    per_node = ar.awq_lite(model, samples, block_size, fuse=False, zero_point=zero_point)
    final = ar.awq_lite(model, samples, block_size, fuse=True, zero_point=zero_point)
    X = ar.capture(model, list(dict.fromkeys(r.act for r in final.weights.values())), samples)
    ratios = clip_ratios()
    out = {}
    for wname, r in final.weights.items():
        w = arr[wname]
        K, N = w.shape
        bs = K if block_size == -1 else block_size
        best, _ = clip_search(np.concatenate(X[r.act], axis=0), w * per_node.weights[wname].scale[:, None], bs, ratios)
        if zero_point:
            quant = r.quant
        else:
            wf = w if r.col_div is None else w / r.col_div[None, :]
            q, s = quant_sym(wf * r.scale[:, None], bs, best)
            quant = _quantized(q, s, block_size, K, N)
            r.quant = quant
        out[wname] = ClipWeight(wname, r.node, r.act, best, quant)
    return out, final

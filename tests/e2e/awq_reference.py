"""Independent numpy reference of AWQ-lite in ModelOpt's arithmetic (reference doc §5.1-5.5), with the
input scale 1/s placed where nibble places it (correctly also for MatMul producers, where ModelOpt
loses it: §5.5 defect 2).

Per quantizable MatMul (input[0] computed, input[1] a 2-D initializer, graph order; nodes whose name
contains an excluded pattern are skipped), ModelOpt's per-node search:

  X        = concat over the calibration samples of the float model's activation, reshaped [-1, K]
             (ONNX Runtime, ORT_DISABLE_ALL, one run per sample, as ModelOpt)
  x_mean   = np.abs(X).mean(0)                                          float32 (numpy's reduction)
  w_mean   = get_weight_scale(W, bs): W zero-padded to Kp, reshaped [bs, Kp*N/bs] (STRIDED groups),
             |W| / (group amax + tiny), padding rows dropped, mean over N         float32
  s(a)     = clip(x_mean**a / (w_mean**(1-a) + tiny), 1e-4, 1e4);  s /= sqrt(max(s)*min(s))
             for a in np.arange(0, 1.1, 0.1) (the .item() values)               float32 numpy
  L(a)     = mean((X W - (X / s) deq(quant(W * s[:, None])))**2)   here in float64 from the float32
             operands (ModelOpt evaluates it in float32; only near-ties can differ)
  alpha    = first a with the minimal L
Siblings (one activation, several weights), fuse on: s = np.concatenate([s_i[:, None]...], 1).mean(1).
Final weight: quant(W' * s[:, None]) with W' = W, or W / s_c[None, :] when a quantized consumer's 1/s
is folded into this weight's columns (done BEFORE quantizing, as nibble does).  RTN = reference.py.

Where 1/s goes (fuse on; fuse off: a `<w>_PQS` Mul for every weight):
  graph input                                    -> `<w>_PQS` Mul per weight, constant `<w>_awq_scale`
  the activation has readers besides the quantized MatMuls -> Mul node
  SimplifiedLayerNormalization                   -> gamma (input 1) / s
  SkipSimplifiedLayerNormalization               -> gamma (input 2) / s   (the bias, input 3, untouched)
  LayerNormalization                             -> scale (1) and bias (2) / s
  Mul with one constant input                    -> constant / s (a scalar becomes [K])
  MatMul with a 2-D constant weight              -> weight columns / s (before quantizing it, if planned)
  anything else                                  -> Mul node `<act>_pre_quant_scale_mul`, constant
                                                    `<act>_pre_quant_scale` [1, K] = 1/s
Every folded value and every Mul constant is computed in float32 (the weight dtype): c / s, 1.0 / s.
fp32 models only.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .reference import Quantized, rtn_quantize

MODELOPT_ALPHAS = [a.item() for a in np.arange(0, 1.0 + 0.1, 0.1)]


# --------------------------------------------------------------------------------------------
# ModelOpt's formulas (§5.1-5.4), written from the reference doc
# --------------------------------------------------------------------------------------------

def act_mean(x: np.ndarray) -> np.ndarray:
    """x_mean of X [T, K]: numpy's mean over the tokens."""
    return np.abs(x).mean(0)


def weight_mean(w: np.ndarray, bs: int) -> np.ndarray:
    """w_mean [K] of W [K, N] with ModelOpt's strided grouping (§5.2)."""
    K, N = w.shape
    pad = (-K) % bs
    wp = np.concatenate([w, np.zeros((pad, N), w.dtype)], axis=0) if pad else w
    flat = wp.reshape(bs, -1)                       # row-major view [bs, Kp*N/bs]: strided groups
    amax = np.abs(flat).max(axis=0, keepdims=True)
    r = (np.abs(flat) / (amax + np.finfo(amax.dtype).tiny)).reshape(wp.shape)[:K]
    return r.mean(1)


def scale_for(x_mean: np.ndarray, w_mean: np.ndarray, alpha: float) -> np.ndarray:
    """s(alpha) (§5.4), numpy float32 arithmetic with a Python float exponent."""
    s = (x_mean ** alpha / (w_mean ** (1 - alpha) + np.finfo(w_mean.dtype).tiny)).clip(min=1e-4, max=1e4)
    return s / np.sqrt(s.max() * s.min())


def awq_loss(x: np.ndarray, w: np.ndarray, s: np.ndarray, bs: int, zero_point: bool) -> tuple[float, float]:
    """(float64 loss, ModelOpt's float32 loss) of scale s for X [T, K], W [K, N]."""
    wq = rtn_quantize(w * s[:, None], bs, zero_point).dequant()
    xs = x * 1.0 / s
    d = x.astype(np.float64) @ w.astype(np.float64) - xs.astype(np.float64) @ wq.astype(np.float64)
    l64 = float(np.mean(d * d))
    d32 = x @ w - xs @ wq
    return l64, float(np.mean(np.power(d32, 2)))


# --------------------------------------------------------------------------------------------
# Activations through ONNX Runtime
# --------------------------------------------------------------------------------------------

def capture(model: onnx.ModelProto, names: list[str], samples: list[dict[str, np.ndarray]]) -> dict[str, list]:
    """{name: [one array per sample]} of the float model's tensors, ORT_DISABLE_ALL, one run per sample.
    `model` must hold its weights inline (onnx.load with external data)."""
    import onnxruntime as ort
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inputs = {i.name for i in m.graph.input}
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in inputs and n not in have:
            m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    fetch = [n for n in names if n not in inputs]
    out: dict[str, list] = {n: [] for n in names}
    for feeds in samples:
        got = dict(zip(fetch, sess.run(fetch, feeds))) if fetch else {}
        for n in names:
            out[n].append(feeds[n] if n in inputs else got[n])
    return out


# --------------------------------------------------------------------------------------------
# The whole transform
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class WeightAwq:
    name: str
    node: str
    act: str
    K: int
    N: int
    x_mean: np.ndarray
    w_mean: np.ndarray
    grid: list[np.ndarray]          # s(a) per alpha
    losses: list[float]             # float64
    losses32: list[float]           # ModelOpt's float32 evaluation
    alpha: float
    scale: np.ndarray = None        # final s [K] (after sibling averaging)
    col_div: np.ndarray | None = None   # a consumer's s folded into this weight's columns
    quant: Quantized = None
    act_scale_in_producer: bool = False  # this weight's 1/s lives in a MatMul producer's columns


@dataclasses.dataclass
class MulNode:
    name: str
    act: str
    const: str
    out: str
    inv: np.ndarray                 # [1, K] float32 = 1 / s
    weights: list[str]


@dataclasses.dataclass
class AwqResult:
    weights: dict[str, WeightAwq]                   # by weight initializer name, graph order
    folded: dict[str, np.ndarray]                   # initializer -> its new value
    muls: dict[str, MulNode]                        # inserted Mul nodes by name
    where: dict[str, str]                           # activation -> where its 1/s went


def _node_names_excluded(name: str, exclude: list[str]) -> bool:
    import re
    return any(re.search(p, name) for p in exclude if p)


def awq_lite(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]], block_size: int = 128,
             fuse: bool = True, zero_point: bool = False, exclude: tuple[str, ...] = ("/lm_head",)) -> AwqResult:
    """ModelOpt-arithmetic awq_lite of an fp32 `model` (weights inline) on calibration `samples`."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    arr = {n: numpy_helper.to_array(t) for n, t in inits.items()}
    planned = []                                    # (node, weight, act) in graph order
    for n in g.node:
        if n.op_type not in ("MatMul", "Gemm") or _node_names_excluded(n.name, list(exclude)):
            continue
        if len(n.input) < 2 or n.input[0] in inits or n.input[1] not in inits or arr[n.input[1]].ndim != 2:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert n.op_type == "MatMul" or not attrs.get("transB", 0), "Gemm transB=1 not covered by this reference"
        assert arr[n.input[1]].dtype == np.float32, "fp32 models only"
        planned.append((n, n.input[1], n.input[0]))
    acts = list(dict.fromkeys(a for _, _, a in planned))
    X = capture(model, acts, samples)

    res = AwqResult({}, {}, {}, {})
    for n, wname, a in planned:
        w = arr[wname]
        K, N = w.shape
        x = np.concatenate(X[a], axis=0).reshape(-1, K)
        bs = K if block_size == -1 else block_size
        xm, wm = act_mean(x), weight_mean(w, bs)
        grid = [scale_for(xm, wm, al) for al in MODELOPT_ALPHAS]
        ls = [awq_loss(x, w, s, bs, zero_point) for s in grid]
        l64 = [l for l, _ in ls]
        best = min(range(len(l64)), key=l64.__getitem__)   # first minimum
        res.weights[wname] = WeightAwq(wname, n.name, a, K, N, xm, wm, grid, l64, [l for _, l in ls],
                                       MODELOPT_ALPHAS[best])
        res.weights[wname].scale = grid[best]

    siblings: dict[str, list[str]] = {}
    for _, wname, a in planned:
        siblings.setdefault(a, []).append(wname)
    if fuse:
        for a, names in siblings.items():
            mean = np.concatenate([res.weights[w].scale[:, np.newaxis] for w in names], axis=1).mean(axis=1)
            for w in names:
                res.weights[w].scale = mean

    # --- placement of 1/s ---
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    for o in g.output:
        readers[o.name] = readers.get(o.name, 0) + 1
    planned_w = {w for _, w, _ in planned}
    consumers = {a: [n for n, _, aa in planned if aa == a] for a in acts}

    def pqs(wname: str):
        s = res.weights[wname].scale
        res.muls[wname + "_PQS"] = MulNode(wname + "_PQS", res.weights[wname].act, wname + "_awq_scale",
                                           wname + "_PQS_Tensor", (1.0 / s)[None, :], [wname])

    def private(name: str) -> bool:
        return name in inits and readers.get(name, 0) == 1

    for a, names in siblings.items():
        s = res.weights[names[0]].scale
        K = s.size
        if not fuse or a not in producer:
            for w in names:
                pqs(w)
            res.where[a] = "per-weight Mul"
            continue
        p = producer[a]
        ins = list(p.input)
        const = lambda i: i < len(ins) and ins[i] and ins[i] in inits  # noqa: E731
        where = None                                # None: a Mul node
        if readers.get(a, 0) != len(consumers[a]):
            pass                                    # something else reads the activation
        elif p.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization"):
            targets = {"SimplifiedLayerNormalization": [1], "SkipSimplifiedLayerNormalization": [2],
                       "LayerNormalization": [1, 2]}[p.op_type]
            targets = [t for t in targets if t < len(ins) and ins[t]]
            if all(const(t) and private(ins[t]) and arr[ins[t]].shape == (K,) for t in targets):
                for t in targets:
                    res.folded[ins[t]] = arr[ins[t]] / s
                where = f"{p.op_type} " + ", ".join(ins[t] for t in targets)
        elif p.op_type == "Mul":
            cs = [i for i in (0, 1) if const(i)]
            if len(cs) == 1 and private(ins[cs[0]]) and arr[ins[cs[0]]].size in (1, K):
                c = arr[ins[cs[0]]]
                res.folded[ins[cs[0]]] = (c.reshape(()) / s) if c.size == 1 else (c.reshape(-1) / s).reshape(c.shape)
                where = f"Mul constant {ins[cs[0]]}"
        elif p.op_type == "MatMul" and not const(0) and const(1) and private(ins[1]) and arr[ins[1]].ndim == 2:
            if ins[1] in planned_w:
                res.weights[ins[1]].col_div = s
            else:
                res.folded[ins[1]] = arr[ins[1]] / s[None, :]
            for w in names:
                res.weights[w].act_scale_in_producer = True
            where = f"MatMul columns {ins[1]}"
        if where is None:
            res.muls[a + "_pre_quant_scale_mul"] = MulNode(a + "_pre_quant_scale_mul", a, a + "_pre_quant_scale",
                                                           a + "_pre_quant_scale_out", (1.0 / s)[None, :], names)
            where = "Mul node"
        res.where[a] = where

    for wname, r in res.weights.items():
        w = arr[wname]
        if r.col_div is not None:
            w = w / r.col_div[None, :]
        r.quant = rtn_quantize(w * r.scale[:, None], block_size, zero_point)
    return res


def equivalent_float_model(model: onnx.ModelProto, res: AwqResult) -> onnx.ModelProto:
    """The float model with every quantized weight replaced by what the quantized graph computes
    with it: diag(1/s) deq(q) — or deq(q) alone where the 1/s lives in a MatMul producer's columns
    (which the producer's deq(q) already carries).  Norms, Mul constants and the graph are unchanged,
    so ORT on it gives the outputs the quantized model must give, up to float rounding."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        r = res.weights.get(t.name)
        if r is None:
            continue
        wq = r.quant.dequant().astype(np.float64)
        if not r.act_scale_in_producer:
            wq = wq / r.scale.astype(np.float64)[:, None]
        t.CopyFrom(numpy_helper.from_array(wq.astype(np.float32), t.name))
    return m


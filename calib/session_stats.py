"""Statistics computed inside the ONNX Runtime session, for a GPU execution provider.

The numpy path (accumulator.py) fetches every activation's token rows from the session and folds them
into XᵀX on the host: on a GPU that moves tokens × ΣK floats per batch over PCIe and leaves the largest
arithmetic of calibration (about 9e13 flops for a 7B model on 16k tokens) to the CPU. Here the graph
itself computes, per batch and per activation X reshaped [T, K], Xc = X ⊙ counted (the rows the
statistics count), only what the algorithm keeps of XᵀX (pass_plan.Part says which rows):

    whole Gram      Xcᵀ Xc                            float32 [K, K]
    a row panel     Xc[:, r0:r1]ᵀ Xc[:, r0:]          float32 [r1-r0, K-r0]  (the upper part; the host
                                                      mirrors the rest from the earlier panels)
    diagonal blocks [G, B, T] @ [G, T, B] of Xc       float32 [G, B, B], G = ceil(K/B) (awq_clip, --gram_block;
                    zero-padded to G·B columns        the last block zero-padded as the numpy path's)

and, with an activation's first part, sum_cnt = Σ_rows |Xc|, sum_all = Σ_rows |X| (every row, as ModelOpt's
mean) and the shape [T, K]. The MatMuls run on the provider's device and only what is kept comes back.
The summation order is the provider's, not numpy's: ModelOpt-mode parity, which needs numpy's exact mean,
is a CPU-provider promise, and the CPU provider keeps the numpy path (capture_run.stats_in_session).
"""
from __future__ import annotations

import numpy as np

# graph input: float32 [R, 1], 1 for a counted row and 0 for padding, or [1, 1] ones when every row counts
COUNTED = "nibble_counted_rows"
HEAD_SUFFIXES = ("::nibble_sum_counted", "::nibble_sum_all", "::nibble_shape")


def gram_output(name: str, r0: int, gram_block: int) -> str:
    """The session output of one part of an activation's Gram statistic."""
    return f"{name}::nibble_gram_blocks" if gram_block > 0 else f"{name}::nibble_gram_rows{r0}"


def part_outputs(name: str, part, gram_block: int, keep_rows: bool) -> list[str]:
    """Every output the session returns for one part (the activation itself for the token sample)."""
    outs = [gram_output(name, part.r0, gram_block)]
    if part.head:
        outs += [name + s for s in HEAD_SUFFIXES] + ([name] if keep_rows else [])
    return outs


def _opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


class _Nodes:
    """The nodes and initializers being added, and the helpers that differ by opset."""

    def __init__(self, opset: int):
        from onnx import helper, numpy_helper
        self.h, self.nh, self.opset = helper, numpy_helper, opset
        self.nodes, self.inits, self.names = [], [], set()

    def node(self, op: str, ins: list[str], out: str, **attrs) -> str:
        self.nodes.append(self.h.make_node(op, ins, [out], **attrs))
        return out

    def const(self, name: str, values) -> str:
        if name not in self.names:
            self.names.add(name)
            self.inits.append(self.nh.from_array(np.asarray(values, np.int64), name))
        return name

    def reduce_rows(self, x: str, out: str) -> str:
        """out = ReduceSum(|x|, axis 0): axes are an input from opset 13 on, an attribute before."""
        a = self.node("Abs", [x], out + "/abs")
        if self.opset >= 13:
            return self.node("ReduceSum", [a, self.const("nibble_axes_0", [0])], out, keepdims=0)
        return self.node("ReduceSum", [a], out, axes=[0], keepdims=0)

    def pad_columns(self, x: str, n: int, out: str) -> str:
        """x [T, K] with n zero columns appended: pads are an input from opset 11 on, an attribute before."""
        if self.opset >= 11:
            return self.node("Pad", [x, self.const(f"nibble_pad_cols_{n}", [0, 0, 0, n])], out)
        return self.node("Pad", [x], out, pads=[0, 0, 0, n])

    def columns(self, x: str, lo: int, hi: int, axis: int, out: str) -> str:
        """Columns (axis 1) or rows (axis 0) lo..hi-1 of a 2-D x: Gather, the same in every opset."""
        return self.node("Gather", [x, self.const(f"nibble_idx_{lo}_{hi}", np.arange(lo, hi))], out, axis=axis)


def _gram_nodes(n: _Nodes, name: str, K: int, xc: str, parts, gram_block: int) -> None:
    base = name + "::nibble"
    if gram_block > 0:
        B = gram_block
        G = -(-K // B)
        xp = xc if G * B == K else n.pad_columns(xc, G * B - K, base + "/padded")
        x3 = n.node("Reshape", [xp, n.const(f"nibble_shape_blocks_{G}_{B}", [-1, G, B])], base + "/blocks")
        gtb = n.node("Transpose", [x3], base + "/gtb", perm=[1, 0, 2])
        gbt = n.node("Transpose", [x3], base + "/gbt", perm=[1, 2, 0])
        n.node("MatMul", [gbt, gtb], gram_output(name, 0, B))
        return
    xt = n.node("Transpose", [xc], base + "/countedT", perm=[1, 0])
    for p in parts:
        lhs = xt if (p.r0, p.r1) == (0, K) else n.columns(xt, p.r0, p.r1, 0, f"{base}/rows{p.r0}")
        rhs = xc if p.r0 == 0 else n.columns(xc, p.r0, K, 1, f"{base}/cols{p.r0}")
        n.node("MatMul", [lhs, rhs], gram_output(name, p.r0, 0))


def add_stat_outputs(model, items: list[tuple[str, int, list]], gram_block: int = 0, keep_rows: bool = False):
    """A copy of `model` (already cut to the activations, see model_graph.augmented_model_bytes) whose
    outputs are the statistics of `items` = [(activation name, K, [pass_plan.Part of it in this pass])],
    named as part_outputs() says (with the activation itself when keep_rows: the awq_clip token sample).
    Adds the float32 input COUNTED."""
    import onnx
    from onnx import TensorProto, helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    n = _Nodes(_opset(m))
    g.input.append(helper.make_tensor_value_info(COUNTED, TensorProto.FLOAT, ["counted_rows", 1]))
    del g.output[:]
    for name, K, parts in items:
        base = name + "::nibble"
        x = n.node("Reshape", [name, n.const(f"nibble_shape_{K}", [-1, K])], base + "/rows")
        # float16 activations are multiplied in float32 (a no-op copy for float32 ones)
        x = n.node("Cast", [x], base + "/rows32", to=TensorProto.FLOAT)
        xc = n.node("Mul", [x, COUNTED], base + "/counted")
        _gram_nodes(n, name, K, xc, parts, gram_block)
        if any(p.head for p in parts):
            cnt, alls, shp = (name + s for s in HEAD_SUFFIXES)
            n.node("Shape", [x], shp)
            n.reduce_rows(xc, cnt)
            n.reduce_rows(x, alls)
        for p in parts:
            g.output.extend(onnx.ValueInfoProto(name=o) for o in part_outputs(name, p, gram_block, keep_rows))
    g.node.extend(n.nodes)
    g.initializer.extend(n.inits)
    return m


def counted_column(counted) -> np.ndarray:
    """The COUNTED feed: the padding mask as a float32 column, or [[1]] when every row counts."""
    if counted is None:
        return np.ones((1, 1), np.float32)
    return np.asarray(counted, np.float32).reshape(-1, 1)


def numpy_outputs(name: str, X: np.ndarray, counted, parts, gram_block: int, keep_rows: bool) -> dict:
    """What the session would return for an activation that is a graph input (no node computes it):
    the same statistics of the feed X [T, K], computed with numpy."""
    T, K = X.shape
    X32 = np.asarray(X, np.float32)
    Xc = X32 if counted is None else X32 * np.asarray(counted, np.float32)[:, None]
    out = {}
    for p in parts:
        if gram_block > 0:
            G = -(-K // gram_block)
            Xp = np.zeros((T, G * gram_block), np.float32)
            Xp[:, :K] = Xc
            x3 = Xp.reshape(T, G, gram_block)
            out[gram_output(name, 0, gram_block)] = np.matmul(x3.transpose(1, 2, 0), x3.transpose(1, 0, 2))
        else:
            out[gram_output(name, p.r0, 0)] = Xc[:, p.r0:p.r1].T @ Xc[:, p.r0:]
        if p.head:
            out.update(zip((name + s for s in HEAD_SUFFIXES),
                           (np.abs(Xc).sum(0), np.abs(X32).sum(0), np.array([T, K], np.int64))))
            if keep_rows:
                out[name] = X
    return out

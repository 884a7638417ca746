"""Statistics computed inside the ONNX Runtime session, for a GPU execution provider.

The numpy path (capture.py's Accumulator.update) fetches every activation's token rows from the session
and folds them into XᵀX on the host: on a GPU that moves tokens × ΣK floats per batch over PCIe and
leaves the largest arithmetic of calibration (about 9e13 flops for a 7B model on 16k tokens) to the
CPU. Here the graph itself computes, per batch and per activation X reshaped [R, K]:

    gram    = Xcᵀ Xc            float32 [K, K], Xc = X ⊙ counted (the rows the statistics count)
    sum_cnt = Σ_rows |Xc|       float32 [K]
    sum_all = Σ_rows |X|        float32 [K]     (every row, as ModelOpt's mean)

so the MatMul runs on the provider's device and only K² + 2K floats per activation come back. The
summation order is the provider's, not numpy's: ModelOpt-mode parity, which needs numpy's exact mean,
is a CPU-provider promise, and the CPU provider keeps the numpy path (chosen in capture.py).
"""
from __future__ import annotations

import numpy as np

# graph input: float32 [R, 1], 1 for a counted row and 0 for padding, or [1, 1] ones when every row counts
COUNTED = "nibble_counted_rows"
SUFFIXES = ("::nibble_gram", "::nibble_sum_counted", "::nibble_sum_all", "::nibble_shape")


def _opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


def _reduce_rows(helper, numpy_helper, nodes, inits, x: str, out: str, opset: int) -> None:
    """out = ReduceSum(|x|, axis 0): axes are an input from opset 13 on, an attribute before."""
    a = out + "/abs"
    nodes.append(helper.make_node("Abs", [x], [a]))
    if opset >= 13:
        axes = "nibble_axes_0"
        if not any(t.name == axes for t in inits):
            inits.append(numpy_helper.from_array(np.array([0], np.int64), axes))
        nodes.append(helper.make_node("ReduceSum", [a, axes], [out], keepdims=0))
    else:
        nodes.append(helper.make_node("ReduceSum", [a], [out], axes=[0], keepdims=0))


def add_stat_outputs(model, acts: list[tuple[str, int]], keep_rows: bool = False):
    """A copy of `model` (already cut to the activations, see capture.augmented_model_bytes) whose
    outputs are the statistics of each activation in `acts` ([(name, K)]), named name + SUFFIXES (and
    the activation itself when keep_rows: the awq_clip token sample). Adds the float32 input COUNTED."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    opset = _opset(m)
    nodes, inits = [], []
    g.input.append(helper.make_tensor_value_info(COUNTED, TensorProto.FLOAT, ["counted_rows", 1]))
    del g.output[:]
    if keep_rows:
        g.output.extend(onnx.ValueInfoProto(name=name) for name, _ in acts)
    for name, K in acts:
        shape = f"nibble_shape_{K}"
        if not any(t.name == shape for t in inits):
            inits.append(numpy_helper.from_array(np.array([-1, K], np.int64), shape))
        base = name + "::nibble"
        x = base + "/rows"
        nodes.append(helper.make_node("Reshape", [name, shape], [x]))
        # float16 activations are multiplied in float32 (a no-op copy for float32 ones)
        nodes.append(helper.make_node("Cast", [x], [x + "32"], to=TensorProto.FLOAT))
        x = x + "32"
        xc = base + "/counted"
        nodes.append(helper.make_node("Mul", [x, COUNTED], [xc]))
        nodes.append(helper.make_node("Transpose", [xc], [xc + "T"], perm=[1, 0]))
        gram, cnt, alls, shp = (name + s for s in SUFFIXES)
        nodes.append(helper.make_node("MatMul", [xc + "T", xc], [gram]))
        nodes.append(helper.make_node("Shape", [x], [shp]))
        _reduce_rows(helper, numpy_helper, nodes, inits, xc, cnt, opset)
        _reduce_rows(helper, numpy_helper, nodes, inits, x, alls, opset)
        g.output.extend([helper.make_tensor_value_info(gram, TensorProto.FLOAT, [K, K]),
                         helper.make_tensor_value_info(cnt, TensorProto.FLOAT, [K]),
                         helper.make_tensor_value_info(alls, TensorProto.FLOAT, [K]),
                         helper.make_tensor_value_info(shp, TensorProto.INT64, [2])])
    g.node.extend(nodes)
    g.initializer.extend(inits)
    return m


def counted_column(counted) -> np.ndarray:
    """The COUNTED feed: the padding mask as a float32 column, or [[1]] when every row counts."""
    if counted is None:
        return np.ones((1, 1), np.float32)
    return np.asarray(counted, np.float32).reshape(-1, 1)


def numpy_stats(X: np.ndarray, counted) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same three statistics for an activation that is a graph input (not computed by the graph)."""
    X32 = np.asarray(X, np.float32)
    Xc = X32 if counted is None else X32 * np.asarray(counted, np.float32)[:, None]
    return Xc.T @ Xc, np.abs(Xc).sum(0), np.abs(X32).sum(0)

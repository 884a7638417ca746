"""bf16 end to end: a two-MatMul bf16 model (weights, input and output bf16) quantized by nibble; the
INT4 codes and bf16 scales checked against an independent numpy quantization, and the quantized model
run by ONNX Runtime.

nibble's bf16 arithmetic: the scale is max(bf16(amax / 7), bf16(1e-5)), the code rint(w / s) in
float32 clipped to [-8, 7] (ModelOpt has no bf16 path; fp16 rounds the quotient, bf16 does not).

ONNX Runtime 1.24's CPU provider has no bf16 MatMul or DequantizeLinear kernel, so the quantized model
runs after its bf16 tensors are widened to float32 (lossless: every bf16 value is a float32 value); the
one difference from a bf16 execution is that DequantizeLinear's product code * scale is not rounded back
to bf16, and the numpy forward it is compared with does the same (float32 dequantized weights)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from .conftest import Graph, ort_run

BF16 = ml_dtypes.bfloat16
K1, N1, N2, BLOCK = 96, 80, 48, 32


def bf16(a) -> np.ndarray:
    """Rounded to bf16 (nearest even), returned as float32."""
    return np.asarray(a, np.float32).astype(BF16).astype(np.float32)


def make_model(path: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    w = {"w1": bf16(rng.standard_normal((K1, N1)) / np.sqrt(K1)),
         "w2": bf16(rng.standard_normal((N1, N2)) / np.sqrt(N1))}
    w["w1"][:, 0] = 0.0  # an all-zero column: the smallest scale
    inits = [helper.make_tensor(n, TensorProto.BFLOAT16, a.shape, a.astype(BF16).tobytes(), raw=True)
             for n, a in w.items()]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="/l0/MatMul"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="/l1/MatMul")]
    g = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [None, K1])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [None, N2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save(m, path)
    return w


def numpy_rtn(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes [K, N] and scales [G, N] of symmetric INT4 blocks along K, nibble's bf16 arithmetic."""
    K, N = w.shape
    G = (K + BLOCK - 1) // BLOCK
    amax = np.abs(np.pad(w, ((0, G * BLOCK - K), (0, 0)))).reshape(G, BLOCK, N).max(axis=1)
    s = np.maximum(bf16(amax / np.float32(7)), bf16(1e-5))
    codes = np.clip(np.rint(w / np.repeat(s, BLOCK, axis=0)[:K]), -8, 7).astype(np.int8)
    return codes, s


def widened(path: str) -> onnx.ModelProto:
    """The model with every bf16 initializer, input and output widened to float32."""
    m = onnx.load(path)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.BFLOAT16:
            a = np.frombuffer(t.raw_data, BF16).astype(np.float32).reshape(tuple(t.dims))
            t.CopyFrom(onnx.numpy_helper.from_array(a, t.name))
    for v in list(m.graph.input) + list(m.graph.output):
        if v.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    return m


@pytest.mark.parametrize("fmt", ["dq", "matmulnbits"])
def test_bf16_codes_scales_and_onnxruntime(nibble, tmp_path, fmt):
    (tmp_path / "in").mkdir()
    src = str(tmp_path / "in" / "model.onnx")
    w = make_model(src)
    out = str(tmp_path / "q" / "model.onnx")
    nibble.quantize(src, out, "--algo", "rtn_dq", "--awq_mode", "modelopt", "--block_size", str(BLOCK), "--format", fmt)
    g = Graph(out)
    deq = {}
    for name, a in w.items():
        codes, s = numpy_rtn(a)
        if fmt == "dq":
            got, dtype = g.int4(f"{name}_i4")
            assert dtype == TensorProto.INT4
            np.testing.assert_array_equal(got, codes)
            t = g.inits[f"{name}_scale"]
            assert t.data_type == TensorProto.BFLOAT16
            got_s = np.frombuffer(g.raw(t.name), BF16).astype(np.float32).reshape(tuple(t.dims))
            np.testing.assert_array_equal(got_s, s)
        deq[name] = codes.astype(np.float32) * np.repeat(s, BLOCK, axis=0)[:a.shape[0]]
    x = bf16(np.random.default_rng(3).standard_normal((4, K1)))
    onnx.save(widened(out), str(tmp_path / "widened.onnx"))
    y = ort_run(str(tmp_path / "widened.onnx"), {"x": x})["y"]  # accuracy level 1: float32 activations
    # the numpy forward with the dequantized weights (float64; ORT rounds h to float32 between MatMuls)
    y_ref = (x.astype(np.float64) @ deq["w1"]).astype(np.float32).astype(np.float64) @ deq["w2"]
    assert np.max(np.abs(y - y_ref)) <= 1e-4 * np.max(np.abs(y_ref))
    # and it is a quantization of the float model: close, not equal
    y_float = x.astype(np.float64) @ w["w1"] @ w["w2"]
    rel = np.linalg.norm(y - y_float) / np.linalg.norm(y_float)
    assert 1e-3 < rel < 0.25, rel

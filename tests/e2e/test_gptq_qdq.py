"""GPTQ in `--format qdq`: the float weight stored before QuantizeLinear is GPTQ's own s·(q − z), so that
ONNX Runtime's QuantizeLinear, which rounds x / s again, gives back exactly the codes `--format dq` stores.
Checked with ONNX Runtime itself (QuantizeLinear run on the stored tensors), fp32 and fp16, symmetric and
with zero points, gptq and awq_gptq; then the qdq and dq models' outputs agree.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from .conftest import Graph, ort_run
from .models import NP_DTYPE, llama_inputs

BLOCK = 32
SAMPLES = 4


def calib_npz(spec, path: str) -> str:
    rng = np.random.default_rng(5)
    np.savez(path, hidden=rng.standard_normal((SAMPLES, 16, spec.hidden)).astype(NP_DTYPE[spec.dtype]))
    return path


def ort_quantize_linear(g: Graph, node: onnx.NodeProto) -> np.ndarray:
    """ONNX Runtime's QuantizeLinear on the node's own stored inputs and attributes, codes as int8/uint8
    (a Cast after it: ORT hands no 4-bit tensor to numpy)."""
    import onnxruntime as ort
    x, s = g.array(node.input[0]), g.array(node.input[1])
    z, zt = g.int4(node.input[2])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ft = TensorProto.FLOAT16 if x.dtype == np.float16 else TensorProto.FLOAT
    wide = TensorProto.UINT8 if zt == TensorProto.UINT4 else TensorProto.INT8
    zp = helper.make_tensor("z", zt, z.shape, z.astype(np.int64).ravel().tolist())
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("Cast", ["q"], ["y"], to=wide)]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", ft, x.shape),
                                           helper.make_tensor_value_info("s", ft, s.shape)],
                              [helper.make_tensor_value_info("y", wide, x.shape)], initializer=[zp])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "s": s})[0]


def quantize_pair(nibble, model_cache, tmp_path, dtype: str, flags: tuple[str, ...]):
    spec, path = model_cache.llama(dtype=dtype)
    npz = calib_npz(spec, str(tmp_path / "calib.npz"))
    out = {}
    for fmt in ("dq", "qdq"):
        o = str(tmp_path / fmt / "model.onnx")
        nibble.quantize(path, o, "--block_size", str(BLOCK), "--calib_data", npz, "--calib_size", str(SAMPLES),
                        "--format", fmt, *flags)
        out[fmt] = Graph(o)
    return spec, path, out["dq"], out["qdq"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("flags", [("--algo", "gptq"), ("--algo", "gptq", "--use_zero_point", "--gptq_act_order"),
                                   ("--algo", "awq_gptq")], ids=["gptq", "gptq_zp_act", "awq_gptq"])
def test_quantizelinear_gives_back_the_gptq_codes(nibble, model_cache, tmp_path, dtype, flags):
    spec, path, dq, qdq = quantize_pair(nibble, model_cache, tmp_path, dtype, flags)
    qnodes = [n for n in qdq.model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(qnodes) == 5 * spec.layers, [n.name for n in qnodes]   # qkv o gate up down; lm_head float
    original = {t.name for t in Graph(path).model.graph.initializer}
    for n in qnodes:
        weight = n.input[0]
        assert weight.endswith("_dequantized") and weight not in original, weight
        source = weight[:-len("_dequantized")]
        assert source not in qdq.inits, f"{source}: the original float weight is still stored"
        codes, _ = dq.int4(source + "_i4")
        got = ort_quantize_linear(qdq, n)
        differ = int((got.astype(np.int64) != codes.astype(np.int64)).sum())
        assert differ == 0, f"{source}: {differ} of {codes.size} codes differ from dq's"
        assert np.array_equal(qdq.array(n.input[1]), dq.array(source + "_scale")), source


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_qdq_and_dq_models_agree(nibble, model_cache, tmp_path, dtype):
    spec, _, dq, qdq = quantize_pair(nibble, model_cache, tmp_path, dtype, ("--algo", "gptq"))
    feeds = llama_inputs(spec)
    a, b = ort_run(dq.path, feeds, optimize=False), ort_run(qdq.path, feeds, optimize=False)
    for k in a:
        tol = 1e-5 if dtype == "fp32" else 2e-3
        scale = float(np.abs(a[k].astype(np.float32)).max())
        assert np.allclose(b[k].astype(np.float32), a[k].astype(np.float32), rtol=0, atol=tol * scale), k


def test_qdq_output_size_is_the_float_weight_plus_scales(nibble, model_cache, tmp_path):
    _, path, dq, qdq = quantize_pair(nibble, model_cache, tmp_path, "fp32", ("--algo", "gptq"))
    size = lambda g: sum(os.path.getsize(os.path.join(g.folder, f)) for f in os.listdir(g.folder))  # noqa: E731
    assert size(qdq) > size(dq) and size(qdq) >= 0.9 * size(Graph(path))


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("algo", ["awq_lite", "awq_clip", "awq_full"])
def test_quantizelinear_gives_back_the_awq_codes(nibble, model_cache, tmp_path, dtype, algo):
    """AWQ in qdq: the codes are those of W ⊙ s, so QuantizeLinear must read the stored s·(q − z), not W
    (which would give another weight with W ⊙ s's scales: a silently wrong model); awq_clip's codes come
    from W itself, but its fp16 quotients are rounded to fp16 (ONNX Runtime's are not), so it too stores
    s·(q − z)."""
    spec, path, dq, qdq = quantize_pair(nibble, model_cache, tmp_path, dtype, ("--algo", algo))
    qnodes = [n for n in qdq.model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(qnodes) == 5 * spec.layers
    scaled = 0
    for n in qnodes:
        weight = n.input[0]
        source = weight[:-len("_dequantized")] if weight.endswith("_dequantized") else weight
        scaled += weight != source
        codes, _ = dq.int4(source + "_i4")
        got = ort_quantize_linear(qdq, n)
        differ = int((got.astype(np.int64) != codes.astype(np.int64)).sum())
        assert differ == 0, f"{source}: {differ} of {codes.size} codes differ from dq's"
    assert scaled == len(qnodes), scaled

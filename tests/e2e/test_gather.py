"""Embedding (Gather) quantization: --gather_quantize_axis / --gather_block_size.

The test model: input_ids [B, S] -> Gather(embed [V, H]) -> MatMul(up [H, H]) -> MatMul(lm_head [H, V]) ->
logits, with the Gather's output also a graph output, so the dequantized lookup is read directly.
V = 300 and H = 96 are not multiples of block 64 (partial blocks on both axes). Checks:
  * the stored table (codes, scales, zero points) against an independent numpy reference: ModelOpt's
    RTN (reference.rtn_quantize) in --awq_mode modelopt, the block clip search of rtn_search
    (gptq_reference.gptq with XᵀX = I) in nibble mode;
  * ONNX Runtime runs dq, qdq and matmulnbits (GatherBlockQuantized) outputs; the looked-up rows equal
    numpy's dequantized rows; the logits stay close to the float model's;
  * bad flags are one error line; --gather_block_size alone says it has no effect; the report and
    `nibble inspect` list the embedding.
"""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from . import gptq_reference as GR
from . import models as M
from . import reference as R
from .conftest import Graph, attrs, ort_run

V, H = 300, 96
EMB = "model.embed_tokens.weight"


def make_embedding_model(dtype: str = "fp32", tied: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    emb = M.make_weight(rng, V, H, dtype)
    up = M.make_weight(rng, H, H, dtype)
    head = np.ascontiguousarray(emb.T) if tied else M.make_weight(rng, H, V, dtype)
    et = M.ONNX_DTYPE[dtype]
    nodes = [helper.make_node("Gather", [EMB, "input_ids"], ["embeds"], name="/model/embed_tokens/Gather"),
             helper.make_node("MatMul", ["embeds", "up.weight"], ["h"], name="/model/layers.0/mlp/up_proj/MatMul"),
             helper.make_node("MatMul", ["h", "lm_head.MatMul.weight"], ["logits"], name="/lm_head/MatMul")]
    graph = helper.make_graph(
        nodes, "nibble_test_gather", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("logits", et, ["B", "S", V]),
         helper.make_tensor_value_info("embeds", et, ["B", "S", H])],
        initializer=[numpy_helper.from_array(emb, EMB), numpy_helper.from_array(up, "up.weight"),
                     numpy_helper.from_array(head, "lm_head.MatMul.weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def emb_models(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gather_models"))
    out = {}
    for dtype in ("fp32", "fp16"):
        for tied in (False, True):
            out[(dtype, tied)] = M.build_cached(root, f"emb_{dtype}_{int(tied)}",
                                                lambda d=dtype, t=tied: make_embedding_model(d, t))
    return out


IDS = np.array([[0, 1, 63, 64, 299], [150, 7, 7, 298, 31]], np.int64)


def table(path: str) -> np.ndarray:
    return numpy_helper.to_array(onnx.load(path).graph.initializer[0])


def quantize(nibble, src, tmp_path, *args):
    out = str(tmp_path / "o" / "model.onnx")
    r = nibble.quantize(src, out, "--algo", "rtn_dq", *args)
    return Graph(out), r


def dequant_table(g: Graph, axis: int, bs: int, zero_point: bool, names: tuple[str, str, str]) -> np.ndarray:
    """The table [V, H] the quantized model holds: (q - z) * s, from its initializers."""
    data, scale, zp = names
    q, _ = g.int4(data)
    s = g.array(scale)
    z = g.int4(zp)[0] if zero_point else None
    if axis == 1:  # blocks along H: the reference works on the transpose
        return R.dequant(q.T, s.T, bs, None if z is None else z.T).T
    return R.dequant(q, s, bs, z)


# --------------------------------------------------------------------------------------------
# The stored table against the numpy reference
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_modelopt_mode_table_is_modelopts_rtn(nibble, emb_models, tmp_path, axis, zero_point, dtype):
    src = emb_models[(dtype, False)]
    flags = ["--awq_mode", "modelopt", "--gather_quantize_axis", str(axis), "--gather_block_size", "64"]
    # ModelOpt's RTN writes the table symmetric whatever --use_zero_point says (only awq_lite honours it).
    g, _ = quantize(nibble, src, tmp_path, *flags, *(["--use_zero_point"] if zero_point else []))
    w = table(src)
    ref = R.rtn_quantize(w.T if axis == 1 else w, 64, zero_point=False)
    q, dt = g.int4(EMB + "_i4")
    assert dt == TensorProto.INT4 and q.shape == (V, H)
    assert np.array_equal(q.T if axis == 1 else q, ref.q)
    s = g.array(EMB + "_scale")
    assert s.shape == ((V, 2) if axis == 1 else (5, H))
    assert R.bits_equal(s.T if axis == 1 else s, ref.scale_2d())
    dq = g.consumers(EMB + "_i4")[0]
    assert dq.op_type == "DequantizeLinear" and attrs(dq) == {"axis": axis, "block_size": 64}
    assert g.consumers(dq.output[0])[0].op_type == "Gather"
    assert EMB not in g.inits


@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zp"])
def test_nibble_mode_table_is_the_block_clip_search(nibble, emb_models, tmp_path, zero_point):
    src = emb_models[("fp32", False)]
    g, _ = quantize(nibble, src, tmp_path, "--gather_quantize_axis", "1", "--gather_block_size", "32",
                    *(["--use_zero_point"] if zero_point else []))
    w = table(src)
    rq, rs, rz = GR.gptq(w.T.astype(np.float64), np.eye(H), 32, zero_point=zero_point)
    q, dt = g.int4(EMB + "_i4")
    assert dt == (TensorProto.UINT4 if zero_point else TensorProto.INT4)
    assert np.array_equal(q.T, rq), f"{int((q.T != rq).sum())} codes differ"
    assert np.array_equal(g.array(EMB + "_scale").T, rs)
    if zero_point:
        assert np.array_equal(g.int4(EMB + "_zp")[0].T, rz)
    # The search never does worse than plain RTN on the table.
    plain = R.rtn_quantize(w.T, 32, zero_point)
    deq = dequant_table(g, 1, 32, zero_point, (EMB + "_i4", EMB + "_scale", EMB + "_zp"))
    assert np.mean((deq - w) ** 2) < R.mse(w.T, plain)


# --------------------------------------------------------------------------------------------
# ONNX Runtime runs every format; the lookup is numpy's dequantized rows
# --------------------------------------------------------------------------------------------

def float_logits(src):
    return ort_run(src, {"input_ids": IDS})["logits"].astype(np.float64)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("zero_point", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("fmt", ["dq", "qdq", "matmulnbits"])
def test_ort_lookup_equals_numpy_dequant(nibble, emb_models, tmp_path, axis, zero_point, fmt):
    src = emb_models[("fp32", False)]
    args = ["--format", fmt, "--gather_quantize_axis", str(axis), "--gather_block_size", "64"]
    g, _ = quantize(nibble, src, tmp_path, *args, *(["--use_zero_point"] if zero_point else []))
    if fmt == "matmulnbits":
        node = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
        assert node.domain == "com.microsoft"
        assert attrs(node) == {"gather_axis": 0, "quantize_axis": axis, "block_size": 64, "bits": 4}
        names = tuple(node.input[i] if i < len(node.input) else "" for i in (0, 2, 3))
        deq = dequant_table(g, axis, 64, zero_point, names)
    elif fmt == "dq":
        deq = dequant_table(g, axis, 64, zero_point, (EMB + "_i4", EMB + "_scale", EMB + "_zp"))
    else:  # qdq: the float table stays, QuantizeLinear makes the codes at run time (round half to even)
        s = g.array(EMB + "_scale")
        z = g.int4(EMB + "_zp")[0]
        w = table(src)
        wa, sa, za = (w.T, s.T, z.T) if axis == 1 else (w, s, z)
        q = R.ort_quantize_linear(wa, sa, 64, za if zero_point else None, signed=not zero_point)
        deq = R.dequant(q, sa, 64, za if zero_point else None)
        deq = deq.T if axis == 1 else deq
    got = ort_run(g.path, {"input_ids": IDS})
    assert np.array_equal(got["embeds"], deq[IDS].astype(np.float32)), np.abs(got["embeds"] - deq[IDS]).max()
    ref = float_logits(src)
    rel = np.abs(got["logits"] - ref).max() / np.abs(ref).max()
    assert rel < 0.25, rel  # INT4 table and up_proj; measured 0.07-0.10


def test_fp16_gather_block_quantized_runs(nibble, emb_models, tmp_path):
    src = emb_models[("fp16", False)]
    g, _ = quantize(nibble, src, tmp_path, "--format", "matmulnbits", "--gather_quantize_axis", "1")
    node = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
    assert g.inits[node.input[2]].data_type == TensorProto.FLOAT16
    deq = dequant_table(g, 1, 32, False, (node.input[0], node.input[2], ""))
    got = ort_run(g.path, {"input_ids": IDS})["embeds"]
    assert got.dtype == np.float16 and np.array_equal(got, deq[IDS])


# --------------------------------------------------------------------------------------------
# Flags, report, inspect
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--gather_quantize_axis", "2"], "--gather_quantize_axis 2"),
    (["--gather_quantize_axis", "x"], "--gather_quantize_axis x"),
    (["--gather_quantize_axis", "1", "--gather_block_size", "24"], "--gather_block_size 24"),
    (["--gather_quantize_axis", "1", "--gather_block_size", "8"], "--gather_block_size 8"),
])
def test_bad_gather_flags_are_one_error_line(nibble, emb_models, tmp_path, args, needle):
    r = nibble.quantize(emb_models[("fp32", False)], str(tmp_path / "o" / "model.onnx"), "--algo", "rtn_dq", *args,
                        check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and lines[-1].startswith("nibble: error: ") and needle in lines[-1], r.describe()
    assert not os.path.exists(tmp_path / "o" / "model.onnx")


def test_block_size_alone_has_no_effect(nibble, emb_models, tmp_path):
    g, r = quantize(nibble, emb_models[("fp32", False)], tmp_path, "--gather_block_size", "64")
    assert "--gather_block_size 64: no effect without --gather_quantize_axis" in r.stderr
    assert EMB in g.inits and g.consumers(EMB)[0].op_type == "Gather"


def test_report_and_inspect_show_the_embedding(nibble, emb_models, tmp_path):
    src = emb_models[("fp32", False)]
    rep = str(tmp_path / "r.json")
    quantize(nibble, src, tmp_path, "--gather_quantize_axis", "1", "--report", rep)
    report = json.load(open(rep))
    entry = [w for w in report["weights"] if w["op_type"] == "Gather"]
    assert len(entry) == 1 and entry[0]["name"] == EMB and entry[0]["shape"] == [V, H]
    assert entry[0]["block_size"] == 32 and entry[0]["bits"] == 4 and entry[0]["gather_quantize_axis"] == 1
    # codes V*H/2 bytes + fp32 scales V*H/32
    assert entry[0]["bytes_out"] == V * H // 2 + V * (H // 32) * 4
    assert report["summary"]["embeddings_quantized"] == 1
    assert report["options"]["gather_quantize_axis"] == 1
    plain = nibble.run("inspect", src)
    assert "embedding 'model.embed_tokens.weight' stays float" in plain.stdout, plain.describe()
    r = nibble.run("inspect", src, "--gather_quantize_axis", "1")
    assert f"embedding {EMB} [{V}, {H}] fp32 read by 1 Gather(s)" in r.stdout, r.describe()


# --------------------------------------------------------------------------------------------
# Tied embeddings: lm_head's weight is the table's transpose (as SmolLM2's export holds it)
# --------------------------------------------------------------------------------------------

def unpack_b(g: Graph, b: str) -> np.ndarray:
    """MatMulNBits B [N, G, bs/2] -> unsigned codes [N, G * bs]."""
    raw = g.array(b)
    out = np.empty(raw.shape[:2] + (raw.shape[2] * 2,), np.uint8)
    out[..., 0::2] = raw & 0xF
    out[..., 1::2] = raw >> 4
    return out.reshape(raw.shape[0], -1)


@pytest.mark.parametrize("block,zero_point", [(32, False), (16, True)], ids=["sym_b32", "zp_b16"])
def test_tied_table_shares_lm_heads_matmulnbits_data(nibble, emb_models, tmp_path, block, zero_point):
    src = emb_models[("fp32", True)]
    g, r = quantize(nibble, src, tmp_path, "--format", "matmulnbits", "--nodes_to_exclude", "",
                    "--block_size", str(block), "--gather_quantize_axis", "1",
                    *(["--use_zero_point"] if zero_point else []))
    assert "tied to lm_head.MatMul.weight: GatherBlockQuantized reads its MatMulNBits data" in r.stderr
    head = g.nodes["/lm_head/MatMulNBits"]
    gbq = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
    reshape = g.producers(gbq.input[0])[0]
    assert reshape.op_type == "Reshape" and reshape.input[0] == head.input[1]
    assert g.array(reshape.input[1]).tolist() == [V, H // 2]
    assert gbq.input[2] == head.input[2] and (not zero_point or gbq.input[3] == head.input[3])
    assert attrs(gbq)["block_size"] == block
    assert EMB not in g.inits and "lm_head.MatMul.weight" not in g.inits
    assert not any(n.endswith("_Q4") and n.startswith(EMB) for n in g.inits)  # no second copy
    # The lookup is lm_head's dequantized weight, transposed.
    codes = unpack_b(g, head.input[1])[:, :H].astype(np.float64)
    s = np.repeat(g.array(head.input[2]).astype(np.float64), block, axis=1)[:, :H]
    zp = 8.0
    if zero_point:
        zb = g.array(head.input[3])
        z = np.stack([zb & 0xF, zb >> 4], axis=-1).reshape(V, -1)[:, :H // block]
        zp = np.repeat(z.astype(np.float64), block, axis=1)
    table_hat = ((codes - zp) * s).astype(np.float32)
    got = ort_run(g.path, {"input_ids": IDS})
    assert np.array_equal(got["embeds"], table_hat[IDS])
    ref = float_logits(src)
    assert np.abs(got["logits"] - ref).max() / np.abs(ref).max() < 0.25


def test_tied_but_lm_head_excluded_quantizes_the_table_alone(nibble, emb_models, tmp_path):
    src = emb_models[("fp32", True)]
    g, r = quantize(nibble, src, tmp_path, "--format", "matmulnbits", "--gather_quantize_axis", "1")
    assert "lm_head.MatMul.weight" in g.inits  # excluded by default: float
    gbq = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
    assert gbq.input[0] in g.inits and g.inits[gbq.input[0]].data_type == TensorProto.INT4


def test_tied_odd_block_count_with_zero_point_packs_its_own_zero_points(nibble, emb_models, tmp_path):
    """H = 96 in blocks of 32 is 3 blocks a row: MatMulNBits pads each row of zero points to a byte,
    GatherBlockQuantized packs them flat, so the table shares B and scales but not the zero points."""
    src = emb_models[("fp32", True)]
    g, r = quantize(nibble, src, tmp_path, "--format", "matmulnbits", "--nodes_to_exclude", "", "--block_size", "32",
                    "--gather_quantize_axis", "1", "--use_zero_point")
    head = g.nodes["/lm_head/MatMulNBits"]
    gbq = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
    assert g.producers(gbq.input[0])[0].input[0] == head.input[1] and gbq.input[2] == head.input[2]
    assert gbq.input[3] != head.input[3]
    zb = g.array(head.input[3])  # [V, 2]: blocks 0, 1 in byte 0, block 2 in byte 1
    z = np.stack([zb[:, 0] & 0xF, zb[:, 0] >> 4, zb[:, 1] & 0xF], axis=1).ravel()
    flat = g.array(gbq.input[3]).ravel()
    assert flat.shape == (V * 2,)
    mine = np.stack([flat & 0xF, flat >> 4], axis=1).ravel()[:V * 3]
    assert np.array_equal(mine, z)
    codes = unpack_b(g, head.input[1])[:, :H].astype(np.float64)
    s = np.repeat(g.array(head.input[2]).astype(np.float64), 32, axis=1)
    table_hat = ((codes - np.repeat(z.reshape(V, 3).astype(np.float64), 32, axis=1)) * s).astype(np.float32)
    got = ort_run(g.path, {"input_ids": IDS})
    assert np.array_equal(got["embeds"], table_hat[IDS])


def make_gemm_tied_model() -> onnx.ModelProto:
    """lm_head as Gemm(transB=1) reading the embedding initializer itself."""
    rng = np.random.default_rng(8)
    emb = M.make_weight(rng, V, H, "fp32")
    nodes = [helper.make_node("Gather", [EMB, "input_ids"], ["embeds"], name="/model/embed_tokens/Gather"),
             helper.make_node("Reshape", ["embeds", "flat"], ["h"], name="/model/flatten"),
             helper.make_node("Gemm", ["h", EMB], ["logits"], name="/lm_head/Gemm", transB=1)]
    graph = helper.make_graph(
        nodes, "nibble_test_gemm_tied", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", V]),
         helper.make_tensor_value_info("embeds", TensorProto.FLOAT, ["N", H])],
        initializer=[numpy_helper.from_array(emb, EMB), numpy_helper.from_array(np.array([-1, H], np.int64), "flat")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_same_initializer_under_gemm_transb_is_shared(nibble, tmp_path):
    src = M.build_cached(str(tmp_path / "m"), "gemm_tied", make_gemm_tied_model)
    g, r = quantize(nibble, src, tmp_path, "--format", "matmulnbits", "--nodes_to_exclude", "", "--block_size", "32",
                    "--gather_quantize_axis", "1")
    assert "tied to model.embed_tokens.weight: GatherBlockQuantized reads" in r.stderr
    head = [n for n in g.node_list if n.op_type == "MatMulNBits"][0]
    gbq = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
    assert g.producers(gbq.input[0])[0].input[0] == head.input[1] and EMB not in g.inits
    ids = np.array([0, 5, 299], np.int64)
    got = ort_run(g.path, {"input_ids": ids})
    table_hat = ((unpack_b(g, head.input[1])[:, :H].astype(np.float64) - 8) *
                 np.repeat(g.array(head.input[2]).astype(np.float64), 32, axis=1)).astype(np.float32)
    assert np.array_equal(got["embeds"], table_hat[ids])


def test_tied_in_dq_is_stored_twice(nibble, emb_models, tmp_path):
    src = emb_models[("fp32", True)]
    g, r = quantize(nibble, src, tmp_path, "--nodes_to_exclude", "", "--gather_quantize_axis", "1")
    assert "quantized on its own ('lm_head.MatMul.weight' was not written as MatMulNBits)" in r.stderr
    assert {EMB + "_i4", "lm_head.MatMul.weight_i4"} <= set(g.inits)
    assert EMB not in g.inits and "lm_head.MatMul.weight" not in g.inits


def test_tied_int8_lm_head_shares_at_8_bits(nibble, emb_models, tmp_path):
    """--layers_8bit lm_head: the shared table is read at 8 bits (uint8 data, default zero point 128)."""
    src = emb_models[("fp32", True)]
    g, r = quantize(nibble, src, tmp_path, "--format", "matmulnbits", "--nodes_to_exclude", "", "--layers_8bit",
                    "lm_head", "--gather_quantize_axis", "1")
    assert "--gather_block_size does not apply" in r.stderr
    gbq = g.nodes["/model/embed_tokens/GatherBlockQuantized"]
    head = g.nodes["/lm_head/MatMulNBits"]
    assert attrs(gbq)["bits"] == 8 and attrs(gbq)["block_size"] == attrs(head)["block_size"]
    assert g.producers(gbq.input[0])[0].input[0] == head.input[1]
    b = g.array(head.input[1]).reshape(V, -1)[:, :H].astype(np.float64)
    s = np.repeat(g.array(head.input[2]).astype(np.float64), attrs(head)["block_size"], axis=1)[:, :H]
    table_hat = ((b - 128) * s).astype(np.float32)
    got = ort_run(g.path, {"input_ids": IDS})["embeds"]
    assert np.array_equal(got, table_hat[IDS])
    assert np.abs(got - table(src)[IDS]).max() < np.abs(table(src)).max() / 127  # within one INT8 step

"""RTN quantization end to end: exact codes/scales/zero points against reference.py, graph format
(dq / qdq / matmulnbits), ONNX Runtime outputs against a float64 numpy forward, onnx.checker,
selection rules (lm_head, Gemm transB, shared weights, exclusion regexes), --report.

Tolerances of the ORT comparison (max |y_ort - y_ref| / max |y_ref|, y_ref = float64 forward with
the reference DEQUANTIZED weights, so quantization error itself cancels):
  * fp32: 1e-4.  ORT computes in fp32 (unit roundoff 6e-8); with K <= 240 and 2 layers the
    measured error of the FLOAT model vs the float64 forward is ~5e-7, so 1e-4 leaves 200x margin
    and is still ~100x below the effect of one wrong code in a block of the output.
  * fp16: 5e-3.  Activations are rounded to fp16 between ops (u = 2^-11 = 4.9e-4); the float
    model measures ~3.5e-4, so 5e-3 is ~10 u.  A mis-placed block or code (e.g. transposed
    scales) moves the output by the quantization step ~ amax/7, i.e. several percent; the test
    also checks that the observed error stays below 1/4 of the error between the float model and
    the dequantized one (the quantization effect), so the fp16 check keeps its power.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from . import models as M
from . import reference as R
from .conftest import Graph, attrs, is_data_file_of, listing, ort_fp16_per_axis_quantize_truncates, ort_run

TOL = {"fp32": 1e-4, "fp16": 5e-3}
FORMATS = ["dq", "qdq", "matmulnbits"]
BLOCKS = [16, 32, 128, -1]
ALGO_FOR = {"dq": "rtn_dq", "qdq": "rtn", "matmulnbits": "rtn_dq"}


# --------------------------------------------------------------------------------------------
# Plan: what the output must contain
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class WPlan:
    weight: str
    nodes: list[str]        # consumer node names (2 for a shared weight)
    trans_b: bool           # Gemm transB=1: stored [N, K]
    w: np.ndarray           # float weight as stored


def llama_plan(spec: M.LlamaSpec, exclude=("/lm_head",)) -> dict[str, WPlan]:
    W = M.llama_weights(spec)
    plan = {}
    for node, wname in M.llama_names(spec):
        if any(node.startswith(e) for e in exclude):
            continue
        plan[wname] = WPlan(wname, [node], False, W[wname])
    return plan


def gemm_plan(spec: M.GemmSpec) -> dict[str, WPlan]:
    W = M.gemm_weights(spec)
    plan: dict[str, WPlan] = {}
    for node, wname, tb in M.GEMM_NODES:
        if node.startswith("/lm_head"):
            continue
        if wname in plan:
            plan[wname].nodes.append(node)
        else:
            plan[wname] = WPlan(wname, [node], tb, W[wname])
    return plan


def kn(p: WPlan) -> np.ndarray:
    return p.w.T if p.trans_b else p.w


def mnb_name(node: str) -> str:
    return node[: -len("/MatMul")] + "/MatMulNBits" if node.endswith("/MatMul") else node + "_Q4"


# --------------------------------------------------------------------------------------------
# Reference model builder: the expected output graph, built from reference.py alone.  Used to
# validate reference.py + our reading of the formats in ORT without the binary.
# --------------------------------------------------------------------------------------------

def build_reference_model(src_path: str, plan: dict[str, WPlan], fmt: str, bs: int, zp: bool, out_path: str):
    m = onnx.load(src_path)
    g = m.graph
    quant_nodes = {n: p for p in plan.values() for n in p.nodes}
    still_used = {i for n in g.node if n.name not in quant_nodes for i in n.input}
    keep = [t for t in g.initializer if t.name not in plan or fmt == "qdq" or t.name in still_used]
    new_inits, pre_nodes = [], []
    for p in plan.values():
        qz = R.rtn_quantize(kn(p), bs, zp)
        w = p.weight
        if fmt == "matmulnbits":
            B, sc, zps, mbs = R.pack_matmulnbits(qz)
            new_inits += [numpy_helper.from_array(B, w + "_Q4"), numpy_helper.from_array(sc, w + "_scales")]
            if zps is not None:
                new_inits.append(numpy_helper.from_array(zps, w + "_zero_points"))
            continue
        q, s = qz.q, qz.scale if qz.per_channel else qz.scale_2d()
        z = None if qz.zp is None else (qz.zp if qz.per_channel else qz.zp_2d())
        if p.trans_b:
            q, s = q.T, s.T
            z = None if z is None else z.T
        axis = (0 if p.trans_b else 1) if qz.per_channel else (1 if p.trans_b else 0)
        battr = {} if qz.per_channel else {"block_size": bs}
        s_t = numpy_helper.from_array(np.ascontiguousarray(s), w + "_scale")
        new_inits.append(s_t)
        i4 = TensorProto.UINT4 if zp else TensorProto.INT4
        zname = w + "_zp"
        if z is not None:
            new_inits.append(helper.make_tensor(zname, TensorProto.UINT4, z.shape, R.pack_int4(z), raw=True))
        elif fmt == "qdq":
            new_inits.append(helper.make_tensor(zname, TensorProto.INT4, s.shape, R.pack_int4(np.zeros(s.shape, np.int8)), raw=True))
        if fmt == "dq":
            new_inits.append(helper.make_tensor(w + "_i4", i4, q.shape, R.pack_int4(q), raw=True))
            ins = [w + "_i4", w + "_scale"] + ([zname] if z is not None else [])
            pre_nodes.append(helper.make_node("DequantizeLinear", ins, [w + "_DequantizeLinear_Output"],
                                              name=w + "_DequantizeLinear", axis=axis, **battr))
        else:
            pre_nodes.append(helper.make_node("QuantizeLinear", [w, w + "_scale", zname], [w + "_QuantizeLinear_Output"],
                                              name=w + "_QuantizeLinear", axis=axis, **battr))
            pre_nodes.append(helper.make_node("DequantizeLinear", [w + "_QuantizeLinear_Output", w + "_scale", zname],
                                              [w + "_DequantizeLinear_Output"], name=w + "_DequantizeLinear",
                                              axis=axis, **battr))
    nodes = []
    for n in g.node:
        p = quant_nodes.get(n.name)
        if p is None:
            nodes.append(n)
            continue
        w = p.weight
        if fmt in ("dq", "qdq"):
            n2 = onnx.NodeProto()
            n2.CopyFrom(n)
            n2.input[1] = w + "_DequantizeLinear_Output"
            nodes.append(n2)
            continue
        K, N = kn(p).shape
        qz = R.rtn_quantize(kn(p), bs, zp)
        mbs = R.matmulnbits_block_size(qz)
        ins = [n.input[0], w + "_Q4", w + "_scales"]
        if zp:
            ins.append(w + "_zero_points")
        if n.op_type == "Gemm" and len(n.input) > 2 and n.input[2]:
            ins += [""] * (5 - len(ins)) + [n.input[2]]
        nodes.append(helper.make_node("MatMulNBits", ins, list(n.output), name=mnb_name(n.name),
                                      domain="com.microsoft", K=K, N=N, bits=4, block_size=mbs))
    del g.node[:]
    g.node.extend(pre_nodes + nodes)
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    ops = [o for o in m.opset_import if o.domain not in ("", "ai.onnx")]
    if fmt == "matmulnbits":
        ops.append(helper.make_opsetid("com.microsoft", 1))
    del m.opset_import[:]
    m.opset_import.extend([helper.make_opsetid("", 21)] + ops)
    m.ir_version = max(m.ir_version, 10)
    onnx.save_model(m, out_path)
    onnx.checker.check_model(out_path)


# --------------------------------------------------------------------------------------------
# Checks of one nibble output
# --------------------------------------------------------------------------------------------

def expected_dequant(p: WPlan, bs: int, zp: bool, fmt: str) -> np.ndarray:
    """W_hat as stored (so [N, K] for transB), weight dtype."""
    qz = R.rtn_quantize(kn(p), bs, zp)
    if fmt == "qdq":  # codes produced by ORT's QuantizeLinear from the stored scales / zero points
        trunc = qz.per_channel and p.w.dtype == np.float16 and ort_fp16_per_axis_quantize_truncates()
        q = R.ort_quantize_linear(kn(p), qz.scale_2d(), qz.bs, None if qz.zp is None else qz.zp_2d(), not zp, trunc)
        dq = R.dequant(q, qz.scale_2d(), qz.bs, None if qz.zp is None else qz.zp_2d())
    else:
        dq = qz.dequant()
    return dq.T if p.trans_b else dq


def check_files(out: str):
    base = os.path.basename(out)
    files = listing(os.path.dirname(out))
    g = Graph(out)
    ext = g.external_files()
    assert len(ext) <= 1 and all(is_data_file_of(base, n) for n in ext), \
        f"external data locations {ext}, only one {base}.<hash>.data allowed"
    assert sorted(files) == sorted([base, *ext]), f"unexpected files in the output folder: {files}"
    return g


def check_graph_header(g: Graph, src: Graph, fmt: str):
    assert g.model.ir_version >= 10, f"ir_version {g.model.ir_version}"
    if fmt in ("dq", "qdq"):
        assert g.opset("") == 21, f"default-domain opset {g.opset('')}, 21 expected"
    else:
        assert g.opset("com.microsoft") == 1, f"com.microsoft opset {g.opset('com.microsoft')}"
        assert g.opset("") >= src.opset("")
    for o in src.model.opset_import:
        if o.domain not in ("", "ai.onnx"):
            assert g.opset(o.domain) == o.version, f"opset domain {o.domain!r} lost or changed"


def check_untouched(g: Graph, src: Graph, plan: dict[str, WPlan], fmt: str):
    """Every initializer not quantized (qdq: all of them) keeps name, type, dims, bytes; every node
    not quantized keeps op, inputs, outputs, attributes."""
    quantized_nodes = {n for p in plan.values() for n in p.nodes}
    for name, t in src.inits.items():
        if name in plan and fmt != "qdq":
            continue
        assert name in g.inits, f"initializer {name} missing from the output"
        t2 = g.inits[name]
        assert (t2.data_type, list(t2.dims)) == (t.data_type, list(t.dims)), f"{name}: type/dims changed"
        a, b = src.array(name), g.array(name)
        assert R.bits_equal(a, b) if a.dtype.kind == "f" else np.array_equal(a, b), f"{name}: values changed"
    for n in src.node_list:
        if n.name in quantized_nodes:
            continue
        assert n.name in g.nodes, f"node {n.name} missing from the output"
        n2 = g.nodes[n.name]
        assert (n2.op_type, list(n2.input), list(n2.output), attrs(n2)) == \
               (n.op_type, list(n.input), list(n.output), attrs(n)), f"node {n.name} changed"


def check_dq_like(g: Graph, src: Graph, p: WPlan, fmt: str, bs: int, zp: bool):
    w = p.weight
    qz = R.rtn_quantize(kn(p), bs, zp)
    K, N = qz.K, qz.N
    # scale: [G, N] / [N, G] (transB) / [N] per channel, bitwise
    s_exp = qz.scale if qz.per_channel else (qz.scale_2d().T if p.trans_b else qz.scale_2d())
    assert w + "_scale" in g.inits, f"{w}_scale missing; initializers: {sorted(g.inits)}"
    st = g.inits[w + "_scale"]
    assert st.data_type == src.inits[w].data_type, f"{w}_scale dtype {st.data_type}, weight dtype expected"
    assert list(st.dims) == list(s_exp.shape), f"{w}_scale dims {list(st.dims)}, expected {list(s_exp.shape)}"
    s_got = g.array(w + "_scale")
    if not R.bits_equal(s_got, np.ascontiguousarray(s_exp)):
        bad = np.argwhere(s_got.view(np.uint16 if s_got.dtype == np.float16 else np.uint32) !=
                          np.ascontiguousarray(s_exp).view(np.uint16 if s_got.dtype == np.float16 else np.uint32))
        i = tuple(bad[0])
        pytest.fail(f"{w}_scale differs from reference at {len(bad)} positions, first {i}: "
                    f"got {s_got[i]!r} expected {s_exp[i]!r}")
    # zero point
    zname = w + "_zp"
    if zp or fmt == "qdq":
        assert zname in g.inits, f"{zname} missing"
        z_got, ztype = g.int4(zname)
        assert list(g.inits[zname].dims) == list(s_exp.shape), f"{zname} dims {list(g.inits[zname].dims)}"
        if zp:
            assert ztype == TensorProto.UINT4, f"{zname} type {ztype}, UINT4 expected"
            z_exp = qz.zp if qz.per_channel else (qz.zp_2d().T if p.trans_b else qz.zp_2d())
            assert np.array_equal(z_got, z_exp), f"{zname} differs at {np.argwhere(z_got != z_exp)[:5].tolist()}"
        else:
            assert ztype == TensorProto.INT4, f"{zname} type {ztype}, INT4 expected"
            assert not z_got.any(), f"{zname} not all zeros"
    else:
        assert zname not in g.inits, f"{zname} present in symmetric mode"
    # codes (dq only: qdq keeps the float weight)
    if fmt == "dq":
        assert w + "_i4" in g.inits, f"{w}_i4 missing"
        q_got, qtype = g.int4(w + "_i4")
        assert qtype == (TensorProto.UINT4 if zp else TensorProto.INT4)
        q_exp = qz.q.T if p.trans_b else qz.q
        assert list(g.inits[w + "_i4"].dims) == list(q_exp.shape), f"{w}_i4 dims {list(g.inits[w + '_i4'].dims)}"
        if not np.array_equal(q_got, q_exp):
            bad = np.argwhere(q_got != q_exp)
            i = tuple(bad[0])
            pytest.fail(f"{w}_i4 differs from reference at {len(bad)}/{q_exp.size} codes, first {i}: "
                        f"got {q_got[i]} expected {q_exp[i]} (w={p.w[i]!r})")
        assert w not in g.inits, f"float initializer {w} still present in dq format"
    else:
        assert w in g.inits, f"float {w} must stay in qdq format"
    # nodes
    axis = (0 if p.trans_b else 1) if qz.per_channel else (1 if p.trans_b else 0)
    exp_attrs = {"axis": axis} if qz.per_channel else {"axis": axis, "block_size": bs}
    dq_out = w + "_DequantizeLinear_Output"
    dqn = g.nodes.get(w + "_DequantizeLinear")
    assert dqn is not None and dqn.op_type == "DequantizeLinear" and dqn.domain in ("", "ai.onnx"), \
        f"node {w}_DequantizeLinear missing or wrong: {dqn}"
    zin = [zname] if (zp or fmt == "qdq") else []
    if fmt == "dq":
        assert list(dqn.input) == [w + "_i4", w + "_scale"] + zin, f"DQ inputs {list(dqn.input)}"
    else:
        qn = g.nodes.get(w + "_QuantizeLinear")
        assert qn is not None and qn.op_type == "QuantizeLinear", f"node {w}_QuantizeLinear missing"
        assert list(qn.input) == [w, w + "_scale", zname], f"Q inputs {list(qn.input)}"
        assert list(qn.output) == [w + "_QuantizeLinear_Output"]
        assert attrs(qn) == exp_attrs, f"Q attrs {attrs(qn)}, expected {exp_attrs}"
        assert list(dqn.input) == [w + "_QuantizeLinear_Output", w + "_scale", zname], f"DQ inputs {list(dqn.input)}"
        assert len([n for n in g.node_list if n.op_type == "QuantizeLinear" and n.input[0] == w]) == 1
    assert list(dqn.output) == [dq_out]
    assert attrs(dqn) == exp_attrs, f"DQ attrs {attrs(dqn)}, expected {exp_attrs}"
    # consumers: exactly the planned nodes, weight input rewired, everything else kept
    cons = sorted(n.name for n in g.consumers(dq_out))
    assert cons == sorted(p.nodes), f"{dq_out} consumed by {cons}, expected {sorted(p.nodes)}"
    for name in p.nodes:
        n, n0 = g.nodes[name], src.nodes[name]
        exp_in = list(n0.input)
        exp_in[1] = dq_out
        assert (n.op_type, list(n.input), list(n.output), attrs(n)) == (n0.op_type, exp_in, list(n0.output), attrs(n0)), \
            f"node {name}: {n.op_type} {list(n.input)} {attrs(n)}"


def check_matmulnbits(g: Graph, src: Graph, p: WPlan, bs: int, zp: bool):
    w = p.weight
    qz = R.rtn_quantize(kn(p), bs, zp)
    B, sc, zps, mbs = R.pack_matmulnbits(qz)
    K, N = qz.K, qz.N
    for tname, exp in ((w + "_Q4", B), (w + "_scales", sc)):
        assert tname in g.inits, f"{tname} missing; initializers {sorted(g.inits)}"
        got = g.array(tname)
        assert list(got.shape) == list(exp.shape), f"{tname} dims {list(got.shape)}, expected {list(exp.shape)}"
        if exp.dtype == np.uint8:
            if not np.array_equal(got, exp):
                bad = np.argwhere(got != exp)
                i = tuple(bad[0])
                pytest.fail(f"{tname} differs at {len(bad)}/{exp.size} bytes, first {i}: got {got[i]:#04x} "
                            f"expected {exp[i]:#04x}")
        else:
            assert got.dtype == exp.dtype, f"{tname} dtype {got.dtype}"
            if not R.bits_equal(got, exp):
                i = tuple(np.argwhere(got != exp)[0])
                pytest.fail(f"{tname} differs, first {i}: got {got[i]!r} expected {exp[i]!r}")
    if zp:
        got = g.array(w + "_zero_points")
        assert got.dtype == np.uint8 and list(got.shape) == list(zps.shape), f"zero_points {got.dtype} {got.shape}"
        assert np.array_equal(got, zps), f"{w}_zero_points differ at {np.argwhere(got != zps)[:5].tolist()}"
    else:
        assert w + "_zero_points" not in g.inits
    assert w not in g.inits, f"float {w} still present"
    for name in p.nodes:
        n0 = src.nodes[name]
        nn = mnb_name(name)
        assert nn in g.nodes, f"node {nn} missing; nodes: {sorted(g.nodes)}"
        n = g.nodes[nn]
        assert (n.op_type, n.domain) == ("MatMulNBits", "com.microsoft")
        exp_in = [n0.input[0], w + "_Q4", w + "_scales"] + ([w + "_zero_points"] if zp else [])
        if n0.op_type == "Gemm" and len(n0.input) > 2 and n0.input[2]:
            exp_in += [""] * (5 - len(exp_in)) + [n0.input[2]]
        got_in = list(n.input)
        while got_in and got_in[-1] == "":
            got_in.pop()
        assert got_in == exp_in, f"{nn} inputs {list(n.input)}, expected {exp_in}"
        assert list(n.output) == list(n0.output)
        a = attrs(n)
        exp = {"K": K, "N": N, "bits": 4, "block_size": mbs}
        assert {k: a.get(k) for k in exp} == exp, f"{nn} attrs {a}, expected {exp}"
        assert name not in g.nodes or name == nn


def run_and_check(nibble, src: str, out: str, plan: dict[str, WPlan], fmt: str, bs: int, zp: bool,
                  extra=(), algo=None) -> Graph:
    args = ["--algo", algo or ALGO_FOR[fmt], "--awq_mode", "modelopt", "--format", fmt, "--block_size", str(bs), *extra]
    if zp:
        args.append("--use_zero_point")
    nibble.quantize(src, out, *args)
    g = check_files(out)
    onnx.checker.check_model(out)
    s = Graph(src)
    check_graph_header(g, s, fmt)
    check_untouched(g, s, plan, fmt)
    for p in plan.values():
        if fmt == "matmulnbits":
            check_matmulnbits(g, s, p, bs, zp)
        else:
            check_dq_like(g, s, p, fmt, bs, zp)
    # nothing else quantized
    ops = [n.op_type for n in g.node_list]
    if fmt == "dq":
        assert ops.count("DequantizeLinear") == len(plan), f"{ops.count('DequantizeLinear')} DQ nodes for {len(plan)} weights"
    elif fmt == "qdq":
        assert ops.count("QuantizeLinear") == ops.count("DequantizeLinear") == len(plan)
    else:
        assert ops.count("MatMulNBits") == sum(len(p.nodes) for p in plan.values())
    return g


def check_ort(out: str, src: str, fmt: str, dtype: str, weights: dict, plan: dict[str, WPlan], bs: int, zp: bool,
              forward, feeds):
    wq = dict(weights)
    for name, p in plan.items():
        wq[name] = expected_dequant(p, bs, zp, fmt)
    ref = forward(wq, feeds)
    ref_float = forward(weights, feeds)
    for optimize in ((True, False) if fmt != "matmulnbits" else (True,)):
        got = ort_run(out, feeds, optimize)
        for k, r in ref.items():
            err = float(np.abs(got[k].astype(np.float64) - r).max() / np.abs(r).max())
            qeffect = float(np.abs(ref_float[k] - r).max() / np.abs(r).max())
            assert err <= TOL[dtype], (f"output {k} (ORT {'optimized' if optimize else 'unoptimized'}): "
                                       f"rel err {err:.3g} > {TOL[dtype]} (quantization effect {qeffect:.3g})")
            if qeffect > 0:
                assert err < 0.25 * qeffect, f"output {k}: rel err {err:.3g} not << quantization effect {qeffect:.3g}"


# --------------------------------------------------------------------------------------------
# Reference self-checks (no binary): reference-built models run in ORT as the numpy forward says
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("bs", [16, 128, -1])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_reference_models_run_in_ort(model_cache, tmp_path, dtype, bs, zp, fmt):
    spec, src = model_cache.gemm(dtype=dtype)
    plan = gemm_plan(spec)
    out = str(tmp_path / "ref.onnx")
    build_reference_model(src, plan, fmt, bs, zp, out)
    check_ort(out, src, fmt, dtype, M.gemm_weights(spec), plan, bs, zp,
              lambda w, f: M.gemm_forward(spec, w, f["x"]), M.gemm_inputs(spec))


def test_reference_packing_roundtrip():
    rng = np.random.default_rng(5)
    for K, N, bs in ((80, 7, 16), (200, 9, 128), (33, 5, -1), (64, 3, 32)):
        w = M.make_weight(rng, K, N, "fp32")
        for zp in (False, True):
            qz = R.rtn_quantize(w, bs, zp)
            assert np.array_equal(R.unpack_int4(R.pack_int4(qz.q), qz.q.shape, not zp), qz.q)
            B, sc, zps, mbs = R.pack_matmulnbits(qz)
            assert np.array_equal(R.unpack_matmulnbits(B, K), (qz.q.astype(np.int16) + (0 if zp else 8)).astype(np.uint8))
            assert R.bits_equal(R.dequant_matmulnbits(B, sc, zps, K, mbs), qz.dequant())
    # known values: ONNX int4 low nibble first; ties round half to even; all-zero block
    assert R.pack_int4(np.array([1, -2, 7], np.int8)) == bytes([0xE1, 0x07])
    w = (np.array([[7.0, 0.5, 1.5, 2.5, -0.5, -2.5, 0.0, 0.0]], np.float32).T * 2.0 ** -6).astype(np.float32)
    qz = R.rtn_quantize(np.concatenate([w, np.zeros_like(w)], axis=1), 8)
    assert qz.q[:, 0].tolist() == [7, 0, 2, 2, 0, -2, 0, 0]
    assert qz.scale[0, 1] == np.float32(1e-5) and not qz.q[:, 1].any()


# --------------------------------------------------------------------------------------------
# nibble: the format matrix
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("bs", BLOCKS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_llama(nibble, model_cache, tmp_path, dtype, bs, zp, fmt):
    # fp32 model in opset 17 (must be raised to 21), fp16 in opset 21
    spec, src = model_cache.llama(dtype=dtype, opset=17 if dtype == "fp32" else 21)
    plan = llama_plan(spec)
    out = str(tmp_path / "out" / "model.onnx")
    os.makedirs(os.path.dirname(out))
    run_and_check(nibble, src, out, plan, fmt, bs, zp)
    check_ort(out, src, fmt, dtype, M.llama_weights(spec), plan, bs, zp,
              lambda w, f: M.llama_forward(spec, w, f["hidden"]), M.llama_inputs(spec))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("bs", [32, -1])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_gemm_and_shared_weight(nibble, model_cache, tmp_path, dtype, bs, zp, fmt):
    """Gemm transB=1 + bias (blocks along K of the [N,K] weight), Gemm transB=0, one weight
    shared by two MatMuls (quantized once), lm_head untouched."""
    spec, src = model_cache.gemm(dtype=dtype)
    plan = gemm_plan(spec)
    out = str(tmp_path / "model.onnx")
    g = run_and_check(nibble, src, out, plan, fmt, bs, zp)
    if fmt == "dq":
        assert g.nodes["/model/proj_t/Gemm"].op_type == "Gemm" and attrs(g.nodes["/model/proj_t/Gemm"]).get("transB") == 1
    check_ort(out, src, fmt, dtype, M.gemm_weights(spec), plan, bs, zp,
              lambda w, f: M.gemm_forward(spec, w, f["x"]), M.gemm_inputs(spec))


@pytest.mark.parametrize("storage", ["raw", "typed", "external"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_input_storage(nibble, model_cache, tmp_path, dtype, storage):
    """Weights inline as raw_data, inline typed (float_data / fp16 bits in int32_data), external."""
    spec, src = model_cache.llama(dtype=dtype, storage=storage, layers=1)
    plan = llama_plan(spec)
    out = str(tmp_path / "model.onnx")
    run_and_check(nibble, src, out, plan, "dq", 32, False)
    check_ort(out, src, "dq", dtype, M.llama_weights(spec), plan, 32, False,
              lambda w, f: M.llama_forward(spec, w, f["hidden"]), M.llama_inputs(spec))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("opset", [17, 21])
def test_opset_inputs(nibble, model_cache, tmp_path, opset, fmt):
    spec, src = model_cache.gemm(opset=opset)
    plan = gemm_plan(spec)
    out = str(tmp_path / "model.onnx")
    run_and_check(nibble, src, out, plan, fmt, 16, False)
    check_ort(out, src, fmt, "fp32", M.gemm_weights(spec), plan, 16, False,
              lambda w, f: M.gemm_forward(spec, w, f["x"]), M.gemm_inputs(spec))


def test_default_format_per_algo(nibble, model_cache, tmp_path):
    """--format defaults: dq for rtn_dq, qdq for rtn; --block_size defaults to 128."""
    spec, src = model_cache.gemm()
    plan = gemm_plan(spec)
    s = Graph(src)
    for algo, fmt in (("rtn_dq", "dq"), ("rtn", "qdq")):
        out = str(tmp_path / algo / "model.onnx")
        nibble.quantize(src, out, "--algo", algo, "--awq_mode", "modelopt")
        g = check_files(out)
        for p in plan.values():
            check_dq_like(g, s, p, fmt, 128, False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_selection_rules(nibble, model_cache, tmp_path, fmt):
    """Only MatMul/Gemm with a constant 2-D initializer as input[1] (input[0] not constant) are
    quantized: activation x activation, constant A, 1-D and 3-D weights and a 2-D Gemm C stay.
    (matmulnbits: a Gemm with a 2-D C cannot become MatMulNBits; its representation is free, only
    its numbers are checked.)"""
    src = model_cache.selection()
    s = Graph(src)
    W = {n: s.array(n) for n in M.SEL_QUANTIZED}
    plan = {w: WPlan(w, [node], False, W[w]) for w, node in M.SEL_QUANTIZED.items()}
    out = str(tmp_path / "model.onnx")
    if fmt != "matmulnbits":
        g = run_and_check(nibble, src, out, plan, fmt, 32, False)
    else:
        nibble.quantize(src, out, "--algo", "rtn_dq", "--awq_mode", "modelopt", "--format", fmt, "--block_size", "32")
        g = check_files(out)
        onnx.checker.check_model(out)
        check_matmulnbits(g, s, plan["model.sel.w.weight"], 32, False)
        for name in ("/model/sel/act/MatMul", "/model/sel/const_a/MatMul", "/model/sel/vec/MatMul", "/model/sel/w3d/MatMul"):
            n, n0 = g.nodes.get(name), s.nodes[name]
            assert n is not None and (n.op_type, list(n.input), list(n.output)) == (n0.op_type, list(n0.input), list(n0.output)), name
    for name in M.SEL_UNTOUCHED:
        assert name in g.inits and R.bits_equal(g.array(name), s.array(name)), f"{name} changed"
    x = np.random.default_rng(1).standard_normal((M.SEL_M, M.SEL_H)).astype(np.float32)
    got, ref = ort_run(out, {"x": x}), ort_run(src, {"x": x})
    for k in ("y_act", "y_const_a", "y_vec", "y_w3d"):
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6, err_msg=f"output {k} changed")
    x64 = x.astype(np.float64)
    exp = {"y_w": x64 @ expected_dequant(plan["model.sel.w.weight"], 32, False, fmt).astype(np.float64),
           "y_gemm_c": x64 @ expected_dequant(plan["model.sel.gemm_c.weight"], 32, False, fmt).astype(np.float64)
                       + s.array("model.sel.gemm_c.bias")}
    for k, r in exp.items():
        err = float(np.abs(got[k] - r).max() / np.abs(r).max())
        assert err <= TOL["fp32"], f"output {k}: rel err {err:.3g} vs dequantized reference"


def test_weight_shared_with_excluded_lm_head(nibble, tmp_path):
    """A weight used by a quantized node and by the excluded /lm_head keeps its float initializer."""
    src = M.save(M.make_tied_lm_head(), str(tmp_path / "in" / "model.onnx"))
    out = str(tmp_path / "out" / "model.onnx")
    nibble.quantize(src, out, "--algo", "rtn_dq", "--awq_mode", "modelopt", "--block_size", "16")
    g = check_files(out)
    onnx.checker.check_model(out)
    assert g.nodes["/lm_head/MatMul"].input[1] == "tied.weight"
    assert R.bits_equal(g.array("tied.weight"), Graph(src).array("tied.weight"))
    assert g.nodes["/model/proj/MatMul"].input[1] == "tied.weight_DequantizeLinear_Output"
    q, _ = g.int4("tied.weight_i4")
    assert np.array_equal(q, R.rtn_quantize(Graph(src).array("tied.weight"), 16).q)


@pytest.mark.parametrize("fmt", ["dq", "matmulnbits"])
def test_nodes_to_exclude(nibble, model_cache, tmp_path, fmt):
    """Regexes match at the START of the node name (re.match); giving the flag replaces the
    default ['/lm_head'], so lm_head is quantized then."""
    spec, src = model_cache.llama(layers=2)
    all_plan = llama_plan(spec, exclude=())
    cases = [
        (["/model/layers\\.1/mlp/"], ("/model/layers.1/mlp/",)),
        (["attn"], ()),                                   # not at the start: excludes nothing
        ([".*/attn/", "/lm_head"], ("/model/layers.0/attn/", "/model/layers.1/attn/", "/lm_head")),
    ]
    for i, (regexes, excluded_prefixes) in enumerate(cases):
        plan = {k: v for k, v in all_plan.items() if not any(v.nodes[0].startswith(e) for e in excluded_prefixes)}
        out = str(tmp_path / str(i) / "model.onnx")
        run_and_check(nibble, src, out, plan, fmt, 32, False, extra=["--nodes_to_exclude", *regexes])


@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_report(nibble, model_cache, tmp_path, dtype, zp):
    spec, src = model_cache.gemm(dtype=dtype)
    plan = gemm_plan(spec)
    out = str(tmp_path / "out" / "model.onnx")
    rep = str(tmp_path / "report.json")
    args = ["--algo", "rtn_dq", "--awq_mode", "modelopt", "--block_size", "32", "--report", rep] + (["--use_zero_point"] if zp else [])
    nibble.quantize(src, out, *args)
    with open(rep) as f:
        report = json.load(f)
    assert isinstance(report.get("summary"), dict), f"report summary: {report.get('summary')!r}"
    entries = {e["name"]: e for e in report["weights"]}
    assert len(entries) == len(report["weights"]), "duplicate weight entries (shared weight reported twice?)"
    assert set(entries) == set(plan), f"report weights {sorted(entries)}, expected {sorted(plan)}"
    for name, p in plan.items():
        e = entries[name]
        assert e["node"] in p.nodes, f"{name}: node {e['node']!r} not one of {p.nodes}"
        assert list(e["shape"]) == list(p.w.shape), f"{name}: shape {e['shape']}, stored shape {list(p.w.shape)}"
        assert e["bits"] == 4 and e["block_size"] == 32, e
        exp = R.mse(kn(p), R.rtn_quantize(kn(p), 32, zp))
        assert abs(e["mse"] - exp) <= 1e-6 * exp, f"{name}: report mse {e['mse']!r}, reference {exp!r} " \
                                                  f"(rel diff {abs(e['mse'] - exp) / exp:.3g})"

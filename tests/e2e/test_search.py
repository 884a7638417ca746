"""The calibration-free per-block RTNs end to end: nibble-mode `rtn_dq` / `rtn` (ONNX Runtime's RTN, MLAS's
arithmetic, symmetric or with --use_zero_point), `--algo rtn_lsq` (16-level least-squares scale search) and
`--algo hqq`, against the independent numpy reference of tests/e2e/search_reference.py on real weights (two
SmolLM2-135M projections from /work/golden when it is there, else heavy-tailed random weights), then in ONNX
Runtime: QuantizeLinear of the qdq output reproduces the codes, dq / qdq / MatMulNBits give the same outputs,
and the output error against the float model is below the old grids'.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from . import search_reference as sr
from .conftest import Graph, ort_run

ort_state = pytest.importorskip("onnxruntime.capi._pybind_state")

GOLDEN = "/work/golden/smollm2-fp32/model.onnx"
BS = 64  # divides both K (576 and 1536): the numpy reference takes whole blocks only
PICK = {"/model/layers.0/attn/q_proj/MatMul": None, "/model/layers.3/mlp/down_proj/MatMul": None}


def _golden_weights() -> dict[str, np.ndarray] | None:
    if not os.path.isfile(GOLDEN):
        return None
    g = Graph(GOLDEN)
    out = {}
    for node in PICK:
        if node not in g.nodes:
            return None
        out[node] = g.array(g.nodes[node].input[1])
    return out


def _random_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    out = {}
    for node, (k, n) in zip(PICK, [(576, 576), (1536, 576)]):
        w = rng.standard_t(4, (k, n)).astype(np.float32) * np.float32(0.02)
        out[node] = w
    return out


def _make_model(folder, weights: dict[str, np.ndarray], dtype=np.float32):
    """MatMuls x_i @ w_i of `dtype` (fp16: the SmolLM2 weights rounded to fp16, as the fp16 model holds them)."""
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    nodes, inputs, outputs, inits = [], [], [], []
    for i, (node, w) in enumerate(weights.items()):
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"], name=node))
        inputs.append(helper.make_tensor_value_info(f"x{i}", elem, ["M", w.shape[0]]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", elem, ["M", w.shape[1]]))
        inits.append(numpy_helper.from_array(w.astype(dtype), f"w{i}"))
    m = helper.make_model(helper.make_graph(nodes, "search", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    os.makedirs(folder / "in")
    path = str(folder / "in" / "model.onnx")
    onnx.save(m, path, save_as_external_data=True, location="model.onnx.data")
    rng = np.random.default_rng(1)
    feeds = {f"x{i}": rng.standard_normal((16, w.shape[0])).astype(dtype) for i, w in enumerate(weights.values())}
    return {"path": path, "weights": [w.astype(dtype) for w in weights.values()], "feeds": feeds,
            "root": str(folder), "dtype": dtype}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _make_model(tmp_path_factory.mktemp("search"), _golden_weights() or _random_weights())


@pytest.fixture(scope="module")
def model16(tmp_path_factory):
    return _make_model(tmp_path_factory.mktemp("search16"), _golden_weights() or _random_weights(), np.float16)


def _run(nibble, model, tag: str, *flags: str) -> str:
    out = os.path.join(model["root"], tag, "model.onnx")
    if not os.path.exists(out):
        nibble.quantize(model["path"], out, "--block_size", str(BS), *flags)
    return out


def _params(g: Graph, i: int, zp: bool):
    q, _ = g.int4(f"w{i}_i4")
    s = g.array(f"w{i}_scale")
    z = g.int4(f"w{i}_zp")[0] if zp else None
    return q, s, z


@pytest.mark.parametrize("algo,flags", [("rtn_lsq", ()), ("hqq", ())])
def test_codes_and_scales_match_numpy_reference(nibble, model, algo, flags):
    zp = algo == "hqq" or bool(flags)
    g = Graph(_run(nibble, model, algo + "".join(flags), "--algo", algo, *flags))
    for i, w in enumerate(model["weights"]):
        K, N = w.shape
        G = K // BS
        q, s, z = _params(g, i, zp)
        x = sr.blocks_of(w, BS)
        if algo == "hqq":
            rs, rz, rc = sr.hqq(x)
        else:
            (rs, rc), rz = sr.lsq_symmetric(x), None
        got_s = s.T.reshape(-1)                              # [G, N] -> rows n * G + g
        got_c = q.T.reshape(N * G, BS)
        same = (got_s == rs) & (got_c == rc).all(axis=1)
        if zp:
            same &= z.T.reshape(-1) == rz
        # Near-ties may fall the other way (numpy's pairwise sums and float32 power against nibble's
        # sequential float64 sums and its own power, kernels/hd_pow.h): at most 1 block in 1000 differs.
        assert same.mean() >= 0.999, (algo, flags, i, int((~same).sum()), same.size)
        if algo == "rtn_lsq" and not zp:
            assert (got_c >= -8).all() and (got_c == -8).any()  # the 16th level is used


def test_qdq_quantizelinear_reproduces_the_codes(nibble, model):
    """ONNX Runtime's QuantizeLinear on the qdq output's float weight, scale (negative where the block's
    extreme is positive) and zero point gives the codes of the dq output: exactly for rtn_lsq, and for
    ONNX Runtime's RTN (rtn_dq, rtn) up to exact halves, where its roundf(w * (1 / s) + z) and
    QuantizeLinear's rint(w / s) + z part."""
    for algo, flags in (("rtn_lsq", ()), ("rtn_dq", ()), ("rtn_dq", ("--use_zero_point",))):
        tag = algo + "".join(flags)
        dq = Graph(_run(nibble, model, tag, "--algo", algo, *flags))
        qdq = Graph(_run(nibble, model, tag + "_qdq", "--algo", algo, "--format", "qdq", *flags))
        for i in range(len(model["weights"])):
            node = next(n for n in qdq.node_list if n.op_type == "QuantizeLinear" and n.input[0] == f"w{i}")
            w, s = qdq.array(node.input[0]), qdq.array(node.input[1])
            zp_t = qdq.inits[node.input[2]]
            z = qdq.int4(node.input[2])[0]
            assert (s < 0).any() if not flags else (s > 0).all()
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            ql = helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q"], axis=attrs["axis"],
                                  block_size=attrs["block_size"])
            wide = TensorProto.INT8 if zp_t.data_type == TensorProto.INT4 else TensorProto.UINT8
            cast = helper.make_node("Cast", ["q"], ["c"], to=wide)  # numpy has no 4-bit type
            zt = helper.make_tensor("z", zp_t.data_type, z.shape, z.astype(np.int32).flatten().tolist())
            gr = helper.make_graph([ql, cast], "ql", [], [helper.make_tensor_value_info("c", wide, w.shape)],
                                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s, "s"), zt])
            path = os.path.join(model["root"], f"ql{i}{tag}.onnx")
            onnx.save(helper.make_model(gr, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
            got = ort_run(path, {}, optimize=False)["c"].astype(np.int64)
            want = dq.int4(f"w{i}_i4")[0].astype(np.int64)
            if algo == "rtn_lsq":
                assert np.array_equal(got, want), (i, tag)
                continue
            bs = attrs["block_size"]
            quot = w.astype(np.float32) / np.repeat(s, bs, axis=0)[: w.shape[0]].astype(np.float32)
            parted = got != want
            assert parted.mean() < 1e-3, (i, tag, int(parted.sum()))
            assert np.all(np.abs(np.abs(quot[parted] - np.trunc(quot[parted])) - 0.5) < 1e-4), (i, tag)


def _rel_err(path: str, model) -> float:
    out = ort_run(path, model["feeds"])
    num = den = 0.0
    for i, w in enumerate(model["weights"]):
        ref = model["feeds"][f"x{i}"].astype(np.float64) @ w.astype(np.float64)
        num += float(((out[f"y{i}"] - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return num / den


@pytest.mark.parametrize("algo,flags", [("rtn_dq", ()), ("rtn_lsq", ()), ("hqq", ())])
def test_formats_agree_in_ort_and_beat_the_old_grid(nibble, model, algo, flags):
    errs = {}
    for fmt in ("dq", "qdq", "matmulnbits"):
        errs[fmt] = _rel_err(_run(nibble, model, f"{algo}{''.join(flags)}_{fmt}", "--algo", algo, "--format", fmt,
                                  *flags), model)
    if algo != "hqq":
        assert max(errs.values()) <= 1.0001 * min(errs.values()), errs  # the same codes in every format
    old_sym = _rel_err(_run(nibble, model, "modelopt", "--algo", "rtn_dq", "--awq_mode", "modelopt"), model)
    old_zp = _rel_err(_run(nibble, model, "modelopt_zp", "--algo", "rtn_dq", "--use_zero_point", "--awq_mode",
                           "modelopt"), model)
    e = errs["dq"]
    if algo == "hqq":
        # MatMulNBits keeps HQQ's fractional zero points (dq/qdq round them): the same or better.
        assert errs["matmulnbits"] < errs["dq"], errs
        assert abs(errs["dq"] - errs["qdq"]) <= 1e-4 * errs["dq"], errs
        assert e < 0.8 * old_sym, (e, old_sym)   # below the 15-level symmetric grid
        assert e < 1.1 * old_zp, (e, old_zp)     # and near min/max zero-point RTN (it minimises |·|^0.7)
    elif algo == "rtn_lsq":
        assert e < 0.8 * old_sym, (e, old_sym)
    else:
        assert e < old_sym, (e, old_sym)  # ONNX Runtime's 16 levels against ModelOpt's 15


@pytest.mark.parametrize("fixture", ["model", "model16"])
def test_zero_point_rtn_is_onnx_runtimes(nibble, request, fixture):
    """The zero-point search measured worse perplexity than plain min/max: nibble mode writes ONNX Runtime's
    min/max RTN (its MLAS arithmetic, search_reference.ort_zero_point) bit for bit, where modelopt mode
    keeps ModelOpt's (halves to even, zero point from the stored scale): they part on a few codes only."""
    model = request.getfixturevalue(fixture)
    a = Graph(_run(nibble, model, "rtn_dq--use_zero_point", "--algo", "rtn_dq", "--use_zero_point"))
    b = Graph(_run(nibble, model, "modelopt_zp", "--algo", "rtn_dq", "--use_zero_point", "--awq_mode", "modelopt"))
    parted = 0
    for i, w in enumerate(model["weights"]):
        K, N = w.shape
        G = K // BS
        q, s, z = _params(a, i, True)
        rs, rz, rc = sr.ort_zero_point(sr.blocks_of(w.astype(np.float32), BS), model["dtype"])
        assert np.array_equal(s.T.reshape(-1).astype(np.float32).view(np.uint32), rs.view(np.uint32)), i
        assert np.array_equal(z.T.reshape(-1), rz), i
        assert np.array_equal(q.T.reshape(N * G, BS), rc), i
        mq = b.int4(f"w{i}_i4")[0]
        parted += int((mq != q).sum())
        assert (mq != q).mean() < 0.01, i  # still min/max RTN
    assert parted > 0  # the two arithmetics do differ on these weights


def test_hqq_refusals_and_notes(nibble, model, tmp_path):
    r = nibble.quantize(model["path"], str(tmp_path / "a" / "model.onnx"), "--algo", "hqq", "--awq_mode", "modelopt",
                        check=False)
    assert r.returncode != 0 and "ModelOpt has no HQQ" in r.stderr
    r = nibble.quantize(model["path"], str(tmp_path / "b" / "model.onnx"), "--algo", "hqq")
    assert "zero points" in r.stderr
    assert "--algo hqq --format dq: zero points rounded to integers" in r.stderr
    assert Graph(str(tmp_path / "b" / "model.onnx")).inits["w0_zp"].data_type == TensorProto.UINT4


def test_rtn_lsq_refusals(nibble, model, tmp_path):
    """rtn_lsq searches symmetric scales only and is no ModelOpt method: each refusal is one line, no output."""
    for flags, says in ((("--use_zero_point",), "--algo rtn_lsq --use_zero_point: the least-squares scale search "
                         "is symmetric only"), (("--awq_mode", "modelopt"), "ModelOpt has no RTN search")):
        out = tmp_path / flags[0].strip("-") / "model.onnx"
        r = nibble.quantize(model["path"], str(out), "--algo", "rtn_lsq", *flags, check=False)
        assert r.returncode != 0 and says in r.stderr, r.stderr
        assert len([ln for ln in r.stderr.splitlines() if "error" in ln]) == 1, r.stderr
        assert not out.parent.exists() or not any(out.parent.iterdir())


def _matmulnbits_params(g: Graph, i: int, bs: int):
    """(codes [N * G, bs], scales [N * G], zero points [N * G], zero point dtype) of MatMulNBits i."""
    node = next(n for n in g.node_list if n.op_type == "MatMulNBits" and n.output[0] == f"y{i}")
    b = g.array(node.input[1])                                   # [N, G, bs / 2]
    codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0] * b.shape[1], bs)
    s = g.array(node.input[2]).reshape(-1)
    zt = g.inits[node.input[3]]
    return codes, s, g.array(node.input[3]).reshape(-1), zt.data_type


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_hqq_matmulnbits_float_zero_points(nibble, model, model16, dtype):
    """--algo hqq --format matmulnbits: T1 zero points (the model's float type) with HQQ's fractional z,
    scales, zero points and codes as the numpy reference computes them, and ONNX Runtime's MatMulNBits
    output equal to numpy's x @ ((codes - z) · s) on SmolLM2 layers."""
    m = model if dtype == "fp32" else model16
    path = _run(nibble, m, "hqq_mnb", "--algo", "hqq", "--format", "matmulnbits")
    g = Graph(path)
    out = ort_run(path, m["feeds"])
    want_t = TensorProto.FLOAT if dtype == "fp32" else TensorProto.FLOAT16
    for i, w in enumerate(m["weights"]):
        K, N = w.shape
        codes, s, z, zt = _matmulnbits_params(g, i, BS)
        assert zt == want_t and z.dtype == m["dtype"]
        s32, z32 = s.astype(np.float32), z.astype(np.float32)
        # fractional zero points (a block whose first proximal step does not help keeps rint(-min · is))
        assert (z32 != np.rint(z32)).mean() > 0.5
        rs, rz, rc = sr.hqq_float(sr.blocks_of(w.astype(np.float32), BS), m["dtype"])
        same = (s32 == rs) & (z32 == rz) & (codes == rc).all(axis=1)
        # Near-ties (numpy's pairwise sums and float32 power against sequential float64 sums and hd_pow.h).
        assert same.mean() >= 0.999, (dtype, i, int((~same).sum()), same.size)
        deq = ((codes.astype(np.float32) - z32[:, None]) * s32[:, None]).reshape(N, K).T   # [K, N]
        x = m["feeds"][f"x{i}"].astype(np.float32)
        ref = x.astype(np.float64) @ deq.astype(np.float64)
        got = out[f"y{i}"].astype(np.float64)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert rel < (1e-5 if dtype == "fp32" else 2e-3), (dtype, i, rel)


@pytest.mark.parametrize("fixture", ["model", "model16"])
def test_symmetric_rtn_is_onnx_runtimes(nibble, request, fixture):
    """The default symmetric RTN is ONNX Runtime's (MLAS's arithmetic, search_reference.ort_symmetric) bit for
    bit in the dq format and in MatMulNBits, where its codes are stored offset by 8 with no zero point."""
    model = request.getfixturevalue(fixture)
    a = Graph(_run(nibble, model, "rtn_dq", "--algo", "rtn_dq"))
    m = Graph(_run(nibble, model, "rtn_dq_matmulnbits", "--algo", "rtn_dq", "--format", "matmulnbits"))
    for i, w in enumerate(model["weights"]):
        K, N = w.shape
        G = K // BS
        q, s, _ = _params(a, i, False)
        rs, rc = sr.ort_symmetric(sr.blocks_of(w.astype(np.float32), BS), model["dtype"])
        assert np.array_equal(s.T.reshape(-1).astype(np.float32).view(np.uint32), rs.view(np.uint32)), i
        assert np.array_equal(q.T.reshape(N * G, BS), rc), i
        assert (rs < 0).any() and (rc == -8).any()  # the extreme on code -8, whatever its sign
        # And ONNX Runtime's own kernel (the function its MatMulNBits quantizer calls) on the same weight.
        packed_ort = np.zeros((N, G, BS // 2), np.uint8)
        scales_ort = np.zeros((N, G), model["dtype"])
        ort_state.quantize_matmul_4bits(packed_ort, w, scales_ort, np.zeros((N, (G + 1) // 2), np.uint8), BS, N, K,
                                        True)
        assert np.array_equal(s.T.reshape(-1).astype(np.float32), scales_ort.reshape(-1).astype(np.float32)), i
        node = next(n for n in m.node_list if n.op_type == "MatMulNBits" and n.input[1].startswith(f"w{i}"))
        assert len(node.input) < 4 or node.input[3] == "", node.input  # no zero points: 8 implied
        packed = m.array(node.input[1]).reshape(N, -1)
        codes = np.empty((N, packed.shape[1] * 2), np.uint8)
        codes[:, 0::2], codes[:, 1::2] = packed & 0x0F, packed >> 4
        assert np.array_equal(codes[:, :K].reshape(N * G, BS).astype(np.int16) - 8, rc.astype(np.int16)), i
        assert np.array_equal(packed.reshape(-1), packed_ort.reshape(-1)), i

"""The statistics computed inside the ONNX Runtime session (the path a GPU provider takes,
calib/session_stats.py) run on the CPU provider, against numpy: the session computes only what the
algorithm keeps (awq_clip: the [G, B, B] diagonal blocks; awq_lite: the whole Gram, in row panels when
one activation's would exceed --budget_mb) and every pass returns at most --budget_mb bytes per batch.

Tolerance: the session sums in float32 in ONNX Runtime's order, numpy's reference in float64, so an
entry of XᵀX (a dot product of `rows` float32 products) may differ by rows·2⁻²⁴·(|X|ᵀ|X|) per
rounding; the bound used is 4× that. The |x| sums likewise, with Σ|x|.

Models: test_calib's tiny decoder (H=24, I=40: block 16 leaves a partial last block) through
capture.py; models.make_awq (H=80, I=200, block 32, one activation a graph input) through
`nibble quantize`, NIBBLE_CALIB_STATS_IN_SESSION=on against off.
"""
from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pytest

from . import models
from .conftest import data_file
from .test_awq import CALIB_SAMPLES, CALIB_SEQ, CALIB_SEED, ulps
from .test_calib import ACTS, REPO, acts_json, make_npz, make_tiny, npz_batches, reference_activations, run_capture

PASS_LINE = re.compile(r"calib: pass (\d+)/(\d+): session outputs (\d+) bytes per batch at most "
                       r"\(planned (\d+), --budget_mb (\d+) bytes\)")


def f32_bound(X: np.ndarray) -> np.ndarray:
    """4 · rows · 2⁻²⁴ · |X|ᵀ|X|: the float32 accuracy of XᵀX summed in another order."""
    A = np.abs(X)
    return 4 * X.shape[0] * 2.0 ** -24 * (A.T @ A) + 1e-30


def blocks_of(G: np.ndarray, B: int) -> np.ndarray:
    """The diagonal blocks [ceil(K/B), B, B] of G, the last zero-padded (calib/README.md)."""
    K = G.shape[0]
    out = np.zeros((-(-K // B), B, B))
    for g in range(out.shape[0]):
        kb = min(B, K - g * B)
        out[g, :kb, :kb] = G[g * B:g * B + kb, g * B:g * B + kb]
    return out


def check_against_numpy(out_dir: str, ref: dict[str, np.ndarray], keep: np.ndarray | None) -> dict:
    """Every statistics file of out_dir against numpy in float64 on the reference activations ref
    (name -> X [rows_all, K]); keep: the counted rows (None: all). Returns the index."""
    with open(os.path.join(out_dir, "index.json")) as f:
        idx = json.load(f)
    for e in idx["activations"]:
        K, X = e["K"], ref[e["name"]].astype(np.float64)
        Xc = X if keep is None else X[keep]
        assert e["rows_all"] == X.shape[0] and e["rows"] == Xc.shape[0], e["name"]
        mean = np.fromfile(os.path.join(out_dir, e["mean_abs_np"]), "<f4")
        s = np.fromfile(os.path.join(out_dir, e["sum_abs"]), "<f8")
        col = 4 * X.shape[0] * 2.0 ** -24 * np.abs(X).sum(0) + 1e-30
        assert (np.abs(s - np.abs(Xc).sum(0)) <= col).all(), e["name"]
        assert (np.abs(mean - np.abs(X).mean(0)) <= col / X.shape[0] + 2.0 ** -23 * np.abs(X).mean(0)).all()
        G, bound = Xc.T @ Xc, f32_bound(Xc)
        got = np.fromfile(os.path.join(out_dir, e["gram"]), "<f8")
        B = e.get("gram_block", 0)
        if B:
            got = got.reshape(-1, B, B)
            G, bound = blocks_of(G, B), blocks_of(bound, B) + 1e-30
            assert np.array_equal(got, got.transpose(0, 2, 1)), e["name"]
        else:
            got = got.reshape(K, K)
            assert np.array_equal(got, got.T), f"{e['name']}: the Gram file is not symmetric"
        assert (np.abs(got - G) <= bound).all(), \
            f"{e['name']}: {(np.abs(got - G) > bound).sum()} Gram entries beyond float32 accuracy"
    return idx


def pass_lines(stderr: str) -> list[tuple[int, int, int]]:
    """(bytes the session returned for one batch at most, bytes planned, budget) of every pass."""
    return [(int(m[3]), int(m[4]), int(m[5])) for m in PASS_LINE.finditer(stderr)]


# --------------------------------------------------------------------------------------------
# capture.py on the tiny decoder: the parts the session computes, and the passes' bytes
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny(str(tmp_path_factory.mktemp("tiny_session")))


# budget 3000 B, gram: h0/h1/h2 (K=24) whole (2304 + 208 B); act1/gu (K=40, 6400 + 336 B) cut into rows
# 0..15 (16·40·4 + 336 = 2896 B) and rows 16..39, columns 16..39 (24·24·4 = 2304 B): 7 passes.
# blocks of 16: K=24 -> 2 blocks (2048 + 208 B), K=40 -> 3 blocks (3072 + 336 B), not K² (2304, 6400).
# One pass (no budget): the whole Gram matrices, 3 · 2512 + 2 · 6736 B; the blocks, 3 · 2256 + 2 · 3408 B.
CASES = {"gram": (0, 3000, 7, [2512, 2896, 2304, 2512, 2896, 2304, 2512], 3 * 2512 + 2 * 6736),
         "blocks16": (16, 6000, 3, [2256 + 3408, 2256 + 3408, 2256], 3 * 2256 + 2 * 3408)}


@pytest.mark.parametrize("case", CASES)
def test_session_parts_and_passes(tiny, tmp_path, case):
    B, budget, n_passes, planned, whole = CASES[case]
    npz = make_npz(str(tmp_path), 6, 37, np.random.default_rng(21))
    acts = acts_json(str(tmp_path))
    args = ["capture", "--model", tiny, "--activations", acts, "--eps", "cpu", "--calib_data", npz,
            "--calib_size", 6, "--batch_size", 2, "--mask_padding", 1, "--stats_in_session", "on"]
    if B:
        args += ["--gram_block", B]
    small = run_capture(*args, "--out", tmp_path / "small", "--budget_mb", budget / 2**20)
    assert small.returncode == 0, small.stderr[-3000:]
    one = run_capture(*args, "--out", tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]

    batches = npz_batches(npz, 2)
    ref = {n: np.concatenate([x.reshape(-1, x.shape[-1]) for x in v])
           for n, v in reference_activations(tiny, batches, [n for n, _ in ACTS]).items()}
    keep = np.concatenate([b["attention_mask"].reshape(-1) for b in batches]) != 0
    assert not keep.all()
    for out in ("small", "one"):
        idx = check_against_numpy(str(tmp_path / out), ref, keep)
        assert idx["stats"] == "session"
    assert idx["passes"] == 1
    lines = pass_lines(small.stderr)
    assert [p for _, p, _ in lines] == planned and len(lines) == n_passes
    for got, plan, cap in lines:
        assert got == plan <= cap == budget
    with open(tmp_path / "small" / "index.json") as f:
        assert json.load(f)["passes"] == n_passes
    (got_one, plan_one, _), = pass_lines(one.stderr)
    assert got_one == plan_one == whole


@pytest.mark.parametrize("feeds,budget", [("input_ids", 20000), ("hidden", 100000)])
def test_sample_rows_count_in_the_budget(request, tmp_path, feeds, budget):
    """--sample_tokens (modelopt mode): the session also returns each activation's rows, one per token of
    a batch (2 x 37 of the tiny decoder's input_ids; 2 x 32 of make_awq's hidden states, an npz without
    input_ids); the plan counts them, and the token sample equals the numpy path's."""
    if feeds == "input_ids":
        model = request.getfixturevalue("tiny")
        npz = make_npz(str(tmp_path), 6, 37, np.random.default_rng(22))
        acts = acts_json(str(tmp_path))
    else:
        awq = request.getfixturevalue("awq")
        model, npz = awq["path"], awq["npz"]
        acts = acts_json(str(tmp_path), [(n, x.shape[1]) for n, x in sorted(awq["ref"].items())])
    args = ["capture", "--model", model, "--activations", acts, "--eps", "cpu", "--calib_data", npz,
            "--calib_size", 6, "--batch_size", 2, "--sample_tokens", 16, "--gram_block", 16]
    a = run_capture(*args, "--out", tmp_path / "numpy", "--stats_in_session", "off")
    b = run_capture(*args, "--out", tmp_path / "session", "--stats_in_session", "on", "--budget_mb", budget / 2**20)
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-3000:] + b.stderr[-3000:]
    lines = pass_lines(b.stderr)
    assert len(lines) > 1
    for got, plan, cap in lines:
        assert got == plan <= cap
    samples = {}
    for d in ("numpy", "session"):
        with open(tmp_path / d / "index.json") as f:
            idx = json.load(f)
        samples[d] = [np.fromfile(tmp_path / d / e["token_sample"], "<f4") for e in idx["activations"]]
    assert all(x.size and np.array_equal(x, y) for x, y in zip(samples["numpy"], samples["session"]))


# --------------------------------------------------------------------------------------------
# nibble quantize on models.make_awq: statistics and outputs, session against numpy
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def awq(tmp_path_factory) -> dict:
    root = str(tmp_path_factory.mktemp("awq_session"))
    spec = models.AwqSpec()
    path = models.build_cached(root, spec.tag, lambda: models.make_awq(spec))
    calib = models.awq_hidden(spec, CALIB_SAMPLES, CALIB_SEQ, CALIB_SEED)
    npz = os.path.join(root, "calib.npz")
    np.savez(npz, hidden=calib)
    names = sorted({a for _, _, a in models.AWQ_WEIGHTS})
    ref = reference_activations(path, [{"hidden": calib[i:i + 1]} for i in range(CALIB_SAMPLES)], names)
    ref = {n: np.concatenate([x.reshape(-1, x.shape[-1]) for x in v]) for n, v in ref.items()}
    return {"root": root, "path": path, "npz": npz, "ref": ref}


def test_row_panels_on_make_awq(awq, tmp_path):
    """Row panels of K = 200 activations (budget 40000 B: rows 0..46, 47..111, 112..199) beside whole
    K = 80 ones, the graph input `hidden` among them (its outputs computed with numpy): numpy's
    statistics, each pass within the budget."""
    acts = acts_json(str(tmp_path), [(n, x.shape[1]) for n, x in sorted(awq["ref"].items())])
    p = run_capture("capture", "--model", awq["path"], "--activations", acts, "--eps", "cpu", "--calib_data",
                    awq["npz"], "--calib_size", CALIB_SAMPLES, "--stats_in_session", "on", "--budget_mb",
                    40000 / 2**20, "--out", tmp_path / "out")
    assert p.returncode == 0, p.stderr[-3000:]
    idx = check_against_numpy(str(tmp_path / "out"), awq["ref"], None)
    lines = pass_lines(p.stderr)
    assert len(lines) == idx["passes"] > len(idx["activations"])
    assert all(got == plan <= cap == 40000 for got, plan, cap in lines)
    assert {e["K"] for e in idx["activations"]} == {80, 200}


def read_model(out: str) -> bytes:
    with open(out, "rb") as f, open(data_file(out), "rb") as g:
        return f.read() + g.read()


def initializers(out: str) -> dict[str, np.ndarray]:
    import onnx
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}


@pytest.mark.parametrize("algo", ["awq_clip", "awq_lite"])
def test_nibble_session_stats_equal_numpy(nibble, awq, tmp_path, monkeypatch, algo):
    """Both paths' statistics within float32 accuracy of numpy's. awq_clip (nibble mode: the Gram's
    diagonal blocks) writes the same bytes either way. awq_lite's scales follow mean_abs_np, which the
    session sums in another order: the same INT4 codes, chosen alphas and zero points, the float tensors
    (scales, folded gammas and constants) within 8 ulp (measured on this model: 608 of 5840 float values
    differ, in 23 of the 24 float tensors, by 5 ulp at most)."""
    outs = {}
    for mode in ("off", "on"):
        monkeypatch.setenv("NIBBLE_CALIB_STATS_IN_SESSION", mode)
        outs[mode] = out = str(tmp_path / mode / "model.onnx")
        cache = str(tmp_path / f"cache_{mode}")
        nibble.quantize(awq["path"], out, "--algo", algo, "--block_size", "32", "--calib_data", awq["npz"],
                        "--calib_size", str(CALIB_SAMPLES), "--calib_cache", cache)
        entry, = [d for d in glob.glob(os.path.join(cache, "*")) if os.path.isdir(d)]
        idx = check_against_numpy(entry, awq["ref"], None)
        assert idx["stats"] == ("session" if mode == "on" else "numpy")
        blocks = {e.get("gram_block", 0) for e in idx["activations"]}
        assert blocks == ({32} if algo == "awq_clip" else {0})
        assert "hidden" in {e["name"] for e in idx["activations"]}   # a graph input: numpy in the session path
    if algo == "awq_clip":
        assert read_model(outs["on"]) == read_model(outs["off"])
        return
    a, b = initializers(outs["off"]), initializers(outs["on"])
    assert a.keys() == b.keys()
    for name, x in a.items():
        if x.dtype == np.float32:
            assert ulps(x, b[name]).max() <= 8, name
        else:
            assert np.array_equal(x, b[name]), f"{name}: differs between the two statistics paths"


# --------------------------------------------------------------------------------------------
# The graph nodes in every opset form (Pad and ReduceSum take their arguments as attributes before
# opsets 11 and 13), against numpy_outputs on the same rows
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [9, 11, 13, 21])
@pytest.mark.parametrize("layout", ["blocks8", "panels", "whole"])
def test_stat_nodes_every_opset(opset, layout):
    import sys

    import onnxruntime as ort
    from onnx import TensorProto, helper
    if os.path.join(REPO, "calib") not in sys.path:   # calib's modules import each other by name
        sys.path.append(os.path.join(REPO, "calib"))
    from pass_plan import Part
    from session_stats import COUNTED, add_stat_outputs, counted_column, gram_output, numpy_outputs, part_outputs
    T, K = 53, 20                      # K = 20: blocks of 8 leave a partial last block of 4
    B = 8 if layout == "blocks8" else 0
    parts = {"blocks8": [Part(0, K, 0, K)], "whole": [Part(0, K, 0, K)],
             "panels": [Part(0, K, 0, 7), Part(0, K, 7, 20)]}[layout]
    g = helper.make_graph([helper.make_node("Relu", ["inp"], ["act"]), helper.make_node("Neg", ["act"], ["y"])],
                          "g", [helper.make_tensor_value_info("inp", TensorProto.FLOAT, [T, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, K])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=7 if opset < 21 else 10)
    m = add_stat_outputs(m, [("act", K, parts)], B, keep_rows=False)   # outputs untyped: ORT infers them
    rng = np.random.default_rng(opset)
    x = rng.standard_normal((T, K)).astype(np.float32)
    counted = rng.random(T) < 0.7
    outs = [o for p in parts for o in part_outputs("act", p, B, False)]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip(outs, sess.run(outs, {"inp": x, COUNTED: counted_column(counted)})))
    want = numpy_outputs("act", np.maximum(x, 0), counted, parts, B, False)
    assert got.keys() == want.keys()
    bound = f32_bound(np.maximum(x, 0).astype(np.float64) * counted[:, None])
    bounds = {gram_output("act", p.r0, B): blocks_of(bound, 8) if B else bound[p.r0:p.r1, p.r0:] for p in parts}
    for name, w in want.items():
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        if name in bounds:
            assert (np.abs(got[name] - w) <= bounds[name]).all(), name
        elif name.endswith("shape"):
            assert np.array_equal(got[name], w)
        else:
            np.testing.assert_allclose(got[name], w, rtol=1e-5, err_msg=name)

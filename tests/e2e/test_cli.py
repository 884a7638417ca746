"""Command line: help text, inspect, determinism across thread counts, output folder creation,
relative paths, --quiet."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest

from . import models as M
from .conftest import data_file, folder_digest, is_data_file_of, listing

QUANTIZE_FLAGS = [
    "onnx_path", "output_path", "algo", "block_size", "use_zero_point", "awqlite_alpha_step",
    "awqlite_run_per_subgraph", "awqlite_disable_fuse_nodes", "awqclip_alpha_step", "awqclip_alpha_min",
    "awqclip_bsz_col", "calibration_eps", "calib_size", "dataset", "batch_size", "no_position_ids",
    "add_position_ids", "enable_mixed_quant", "layers_8bit", "nodes_to_exclude", "model_name", "device",
    "format", "threads", "force", "report", "config", "quiet", "verbose",
]


def test_help_lists_every_flag(nibble):
    r = nibble.run("quantize", "--help")
    assert r.returncode == 0, r.describe()
    text = r.stdout + r.stderr
    missing = [f for f in QUANTIZE_FLAGS if f"--{f}" not in text]
    assert not missing, f"`nibble quantize --help` does not mention: {missing}\n{r.describe()}"


def test_top_level_help(nibble):
    r = nibble.run("--help")
    assert r.returncode == 0, r.describe()
    text = r.stdout + r.stderr
    assert "quantize" in text and "inspect" in text, r.describe()


def test_inspect_names_weights(nibble, model_cache):
    spec, src = model_cache.llama()
    before = folder_digest(os.path.dirname(src))
    r = nibble.run("inspect", src)
    assert r.returncode == 0, r.describe()
    missing = [w for node, w in M.llama_names(spec) if not node.startswith("/lm_head") and w not in r.stdout]
    assert not missing, f"inspect does not name {missing}\n{r.describe()}"
    assert folder_digest(os.path.dirname(src)) == before


def test_inspect_gemm_and_shared(nibble, model_cache):
    spec, src = model_cache.gemm()
    r = nibble.run("inspect", src)
    assert r.returncode == 0, r.describe()
    for w in ("model.proj_t.weight", "model.proj.weight", "model.shared.weight"):
        assert w in r.stdout, f"inspect does not name {w}\n{r.describe()}"


def test_inspect_bad_file(nibble, tmp_path):
    p = tmp_path / "junk.onnx"
    p.write_bytes(np.random.default_rng(2).integers(0, 256, 1000, dtype=np.uint8).tobytes())
    r = nibble.run("inspect", str(p))
    assert r.returncode != 0, r.describe()
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nibble: error:") and "junk.onnx" in lines[0], r.describe()


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("fmt,zp", [("dq", False), ("matmulnbits", True), ("qdq", False)])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_threads_deterministic(nibble, model_cache, tmp_path, dtype, fmt, zp):
    spec, src = model_cache.llama(dtype=dtype)
    algo = "rtn" if fmt == "qdq" else "rtn_dq"
    outs = []
    for t in ("1", "2", "3"):
        out = str(tmp_path / f"t{t}" / "model.onnx")
        args = ["--algo", algo, "--format", fmt, "--block_size", "32", "--threads", t]
        nibble.quantize(src, out, *args, *(["--use_zero_point"] if zp else []))
        outs.append(out)
    ref = folder_digest(os.path.dirname(outs[0]))
    for out in outs[1:]:
        assert folder_digest(os.path.dirname(out)) == ref, f"{out} differs from the --threads 1 output"


def test_creates_missing_output_folder(nibble, model_cache, tmp_path):
    _, src = model_cache.gemm()
    out = str(tmp_path / "a" / "b" / "c" / "model.onnx")
    nibble.quantize(src, out, "--algo", "rtn_dq")
    onnx.checker.check_model(out)
    assert sorted(listing(os.path.dirname(out))) == sorted(["model.onnx", os.path.basename(data_file(out))])


def test_relative_paths(nibble, model_cache, tmp_path):
    """Relative --onnx_path/--output_path resolve against the working directory; the external
    data location stays the bare basename."""
    _, src = model_cache.gemm()
    work = tmp_path / "work"
    (work / "in").mkdir(parents=True)
    for f in os.listdir(os.path.dirname(src)):
        (work / "in" / f).write_bytes(open(os.path.join(os.path.dirname(src), f), "rb").read())
    nibble.quantize("in/model.onnx", "q.onnx", "--algo", "rtn_dq", cwd=str(work))
    out = str(work / "q.onnx")
    onnx.checker.check_model(out)
    m = onnx.load(out, load_external_data=False)
    locs = {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"}
    assert len(locs) <= 1 and all(is_data_file_of("q.onnx", n) for n in locs), locs
    assert sorted(os.listdir(work)) == sorted(["in", "q.onnx", *locs])


def test_quiet(nibble, model_cache, tmp_path):
    _, src = model_cache.gemm()
    r = nibble.quantize(src, str(tmp_path / "model.onnx"), "--algo", "rtn_dq", "--quiet")
    assert r.stdout == "" and r.stderr == "", f"--quiet printed something\n{r.describe()}"


def test_report_to_a_pipe_is_written_in_place(nibble, model_cache, tmp_path):
    """--report naming something that is not a file (a FIFO here; /dev/null or /dev/stdout alike) is
    written into it: a temporary renamed over it would replace the node itself."""
    import json
    import stat
    import threading
    _, src = model_cache.gemm()
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("text", open(fifo).read()))
    reader.start()
    nibble.quantize(src, str(tmp_path / "q" / "model.onnx"), "--algo", "rtn_dq", "--report", str(fifo))
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got["text"])["summary"]["bytes_quantized_out"] > 0
    assert not os.path.exists(str(fifo) + ".nibble-part")

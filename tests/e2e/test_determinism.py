"""Same input and flags -> byte-identical output (graph and data file), across repeated runs and
across --threads 1/2/4, for the three output formats, fp32 and fp16, with and without zero points.

The models come from tools/make_llama_shaped.py at a size where the weights are big enough for the
kernels to split them across threads (K up to 1376, N up to 2000), unlike the tiny suite models.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import REPO, data_file, folder_digest

TOOL = os.path.join(REPO, "tools", "make_llama_shaped.py")


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    cache = {}

    def get(dtype: str) -> str:
        if dtype not in cache:
            path = str(tmp_path_factory.mktemp(f"shaped_{dtype}") / "model.onnx")
            subprocess.run([sys.executable, TOOL, "--out", path, "--hidden", "512", "--intermediate", "1376",
                            "--layers", "2", "--vocab", "2000", "--heads", "8", "--dtype", dtype, "--seed", "3",
                            "--quiet"], check=True, timeout=300)
            cache[dtype] = path
        return cache[dtype]

    return get


# Under the sanitizers one case per output kind is enough (the threads split the same loops for every
# dtype and format); the rest are marked slow.
KEPT_UNDER_SANITIZERS = {("fp32", "dq", False), ("fp16", "matmulnbits", True), ("fp16", "qdq", True)}
THREAD_CASES = [pytest.param(d, f, z, id=f"{d}-{f}-{'zp' if z else 'sym'}",
                             marks=() if (d, f, z) in KEPT_UNDER_SANITIZERS else pytest.mark.slow)
                for d in ("fp32", "fp16") for f in ("dq", "qdq", "matmulnbits") for z in (False, True)]


@pytest.mark.parametrize("dtype,fmt,zp", THREAD_CASES)
def test_byte_identical_across_runs_and_threads(nibble, shaped, tmp_path, dtype, fmt, zp):
    src = shaped(dtype)
    extra = ["--use_zero_point"] if zp else []
    digests = {}
    for label, threads in (("t1", "1"), ("t2", "2"), ("t4", "4"), ("t2_again", "2"), ("t0_all_cores", "0")):
        out = tmp_path / label / "model.onnx"
        nibble.quantize(src, str(out), "--algo", "rtn_dq", "--format", fmt, "--threads", threads, "--quiet", *extra)
        digests[label] = folder_digest(str(out.parent))
        assert sorted(digests[label]) == sorted(["model.onnx", os.path.basename(data_file(str(out)))]), digests[label]
    ref = digests["t1"]
    differ = [k for k, d in digests.items() if d != ref]
    assert not differ, f"outputs differ from --threads 1: {differ}\n{digests}"


def test_report_is_deterministic_apart_from_timings(nibble, shaped, tmp_path):
    """The JSON report: everything but seconds and peak RSS is the same across thread counts."""
    import json
    src = shaped("fp16")
    reports = []
    for t in ("1", "4"):
        rep = tmp_path / f"r{t}.json"
        nibble.quantize(src, str(tmp_path / t / "model.onnx"), "--algo", "rtn_dq", "--threads", t, "--quiet",
                        "--report", str(rep))
        r = json.loads(rep.read_text())
        for w in r["weights"]:
            w.pop("seconds", None)
        for k in ("seconds", "fsync_seconds", "stage_seconds", "peak_rss_bytes", "read_gbps"):
            r["summary"].pop(k, None)
        for k in ("seconds", "wait_seconds", "threads"):  # the reads' timings and reader threads (--threads)
            r["summary"]["read"].pop(k)
        r["options"].pop("threads", None)
        r["options"].pop("output_path", None)
        r["options"].pop("report", None)
        reports.append(r)
    assert reports[0] == reports[1]


def test_report_says_where_the_time_went(nibble, shaped, tmp_path):
    """summary.stage_seconds: load, calibrate, search, quantize and write for a calibrated whole-model run
    (only load, quantize and write without calibration), each at least 0, together within the run's
    seconds. Layer by layer: load, layers and write, and the same calibrate, search and quantize as the
    parts of `layers` (every layer's, summed)."""
    import json
    src = shaped("fp16")
    calib = ["--algo", "awq_lite", "--use_random_calib", "--calib_size", "2", "--calib_seq_len", "32"]
    for flags, stages in ((["--algo", "rtn_dq"], {"load", "quantize", "write"}),
                          (calib + ["--layer_by_layer", "off"], {"load", "calibrate", "search", "quantize", "write"}),
                          (calib, {"load", "layers", "calibrate", "search", "quantize", "write"})):
        rep = tmp_path / "r.json"
        nibble.quantize(src, str(tmp_path / "o" / "model.onnx"), *flags, "--quiet", "--force", "--report", str(rep))
        s = json.loads(rep.read_text())["summary"]
        t = s["stage_seconds"]
        assert set(t) == stages, t
        assert all(v >= 0 for v in t.values()), t
        parts = {k: v for k, v in t.items() if not ("layers" in t and k in ("calibrate", "search", "quantize"))}
        assert sum(parts.values()) <= s["seconds"] + 1e-3, (t, s["seconds"])
        if "layers" in t:
            assert abs(t["calibrate"] + t["search"] + t["quantize"] - t["layers"]) <= 1e-6 * t["layers"] + 1e-9, t
        if "calibrate" in t:
            assert t["calibrate"] > 0 and t["search"] > 0


# Calibrated algorithms: the statistics (calib/capture.py), the searches and the sensitivity choice
# must not depend on --threads nor on the BLAS's own thread count. Calibration: seeded random token
# ids (--use_random_calib), 4 windows of 64 tokens.
CALIBRATED = {
    "awq_lite": ["--algo", "awq_lite"],
    "awq_lite_modelopt": ["--algo", "awq_lite", "--awq_mode", "modelopt"],
    "awq_clip": ["--algo", "awq_clip"],
    "awq_full": ["--algo", "awq_full"],
    "mixed_sensitivity": ["--algo", "awq_lite", "--mixed_strategy", "sensitivity"],
    "awq_lite_native": ["--algo", "awq_lite", "--calibration_engine", "native"],  # the layer engine's statistics
}


# awq_clip and the layer engine stay under the sanitizers; the sensitivity run (three runs of 100 s there)
# does not: test_mixed.py's sensitivity tests run that code under them once each.
CALIBRATED_CASES = [pytest.param(c, marks=() if c in ("awq_clip", "awq_lite_native")
                                 else pytest.mark.slow)
                    for c in sorted(CALIBRATED)]


@pytest.mark.parametrize("case", CALIBRATED_CASES)
def test_calibrated_byte_identical_across_threads_and_blas_threads(nibble, shaped, tmp_path, monkeypatch, case):
    src = shaped("fp32")
    digests = {}
    for label, threads, blas in (("t1_blas1", "1", "1"), ("t2_blas2", "2", "2"), ("t2_blas_unset", "2", None)):
        if blas is None:
            monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OPENBLAS_NUM_THREADS", blas)
        out = tmp_path / label / "model.onnx"
        nibble.quantize(src, str(out), *CALIBRATED[case], "--use_random_calib", "--calib_size", "4",
                        "--calib_seq_len", "64", "--threads", threads, "--quiet")
        digests[label] = folder_digest(str(out.parent))
    differ = [k for k, d in digests.items() if d != digests["t1_blas1"]]
    assert not differ, f"{case}: outputs differ from --threads 1 / OPENBLAS_NUM_THREADS=1: {differ}"

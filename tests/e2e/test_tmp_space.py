"""Room for calibration statistics in TMPDIR: a whole-model run that would not fit stops before it
calibrates, with one line; statistics folders of runs that died are swept, those of live runs and of
unknown owners are kept. A small TMPDIR is simulated with NIBBLE_TEST_TMP_FREE_BYTES (the free figure
the check reads)."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

SAMPLES, SEQ = 4, 8


@pytest.fixture(scope="module")
def llama(model_cache, tmp_path_factory):
    spec, path = model_cache.llama(layers=2)
    npz = str(tmp_path_factory.mktemp("tmp_space") / "calib.npz")
    rng = np.random.default_rng(11)
    np.savez(npz, hidden=rng.standard_normal((SAMPLES, SEQ, spec.hidden)).astype(np.float32))
    return spec, path, npz


def quantize(nibble, llama, out, tmp, **env):
    spec, path, npz = llama
    cmd = [nibble.binary, "quantize", "--onnx_path", path, "--output_path", str(out), "--algo", "awq_lite",
           "--calib_data", npz, "--calib_size", str(SAMPLES), "--calibration_eps", "cpu", "--block_size", "32",
           "--layer_by_layer", "off",  # the whole-model pass's check: a layer-by-layer run checks per layer
           "--calibration_engine", "ort"]  # its statistics files (the layer engine keeps them in memory)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp), **env})


def owner_tag(pid: int, start_time: int) -> str:
    boot = open("/proc/sys/kernel/random/boot_id").read().strip().replace("-", "")
    return f"{pid}-{boot}-{start_time}"


def own_start_time() -> int:
    stat = open("/proc/self/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22 of /proc/<pid>/stat


def test_too_little_tmp_space_stops_before_calibrating(nibble, llama, tmp_path):
    spec, path, npz = llama
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "o" / "model.onnx"
    r = quantize(nibble, llama, out, tmp, NIBBLE_TEST_TMP_FREE_BYTES="1000")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    # 2 layers x 4 activations; K = hidden for three of them, intermediate for down_proj: Gram in float64
    K = [spec.hidden] * 3 + [spec.inter]
    need = 2 * sum(k * 12 + k * k * 8 for k in K)
    assert f"needs {need / 1e6:.1f} MB in {tmp}, 0.0 MB free: set TMPDIR to a larger disk" in last, r.stderr
    assert "calib:" not in r.stderr  # nothing was calibrated
    assert os.listdir(tmp) == [] and not out.exists()
    # with the room it needs the same run goes through
    r = quantize(nibble, llama, out, tmp, NIBBLE_TEST_TMP_FREE_BYTES=str(need))
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp) == []


def test_statistics_of_dead_runs_are_swept(nibble, llama, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # our own pid with another start time: a run that died and whose pid was reused
    dead = tmp / f"nibble-calib-{owner_tag(os.getpid(), own_start_time() + 12345)}-abc123"
    live = tmp / f"nibble-calib-{owner_tag(os.getpid(), own_start_time())}-def456"
    unknown = tmp / "nibble-calib-Xy12Zq"  # no owner tag (an older version's): cannot tell, kept
    for d in (dead, live, unknown):
        d.mkdir()
        (d / "a0.gram.f64").write_bytes(b"\0" * 4096)
    r = quantize(nibble, llama, tmp_path / "o" / "model.onnx", tmp)
    assert r.returncode == 0, r.stderr
    assert not dead.exists() and live.exists() and unknown.exists()
    assert f"calibration: removed 0.0 MB of statistics left in {tmp} by runs that died" in r.stderr
    assert sorted(os.listdir(tmp)) == sorted([live.name, unknown.name])  # this run's own folder is gone too

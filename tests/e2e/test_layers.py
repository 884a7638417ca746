"""--layer_by_layer end to end: the graph cut per decoder layer, each layer calibrated on the boundary
the previous one left, searched, quantized and written in turn.

* With the float layers fed forward (the only mode), every layer sees the activations the whole-model
  pass sees, so every output initializer (codes, scales, folded gammas) equals the whole-model run's,
  for awq_lite, awq_clip, awq_full, gptq and awq_gptq, on a Llama-shaped fp32 test model of 4 layers.
* --resume after a SIGKILL in the middle of a run gives the same bytes as a run never stopped.
* A graph with no layer numbers falls back to the whole-model pass with one line.
* --layer_by_layer auto (the default) goes layer by layer on a cuttable graph, and takes the whole-model
  pass, with one line saying why, for a graph without layers, --awq_mode modelopt, --calib_cache and
  calibration-free algorithms; off forces the whole-model pass; the report records the pass in effect.
* Checkpoints are never lost: a re-run without --resume refuses and keeps the stopped run's state,
  --resume on another model at the same path is refused, and a second run on a live run's output refuses.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import onnx
import pytest

from . import models
from .conftest import folder_digest

LAYERS, SAMPLES, SEQ = 4, 6, 16


@pytest.fixture(scope="module")
def llama(model_cache, tmp_path_factory):
    spec, path = model_cache.llama(layers=LAYERS)
    root = str(tmp_path_factory.mktemp("layers"))
    rng = np.random.default_rng(5)
    npz = os.path.join(root, "calib.npz")
    np.savez(npz, hidden=rng.standard_normal((SAMPLES, SEQ, spec.hidden)).astype(np.float32))
    return spec, path, npz, root


def calib_args(npz: str) -> list[str]:
    return ["--calib_data", npz, "--calib_size", str(SAMPLES), "--calibration_eps", "cpu", "--block_size", "32"]


def initializers(path: str) -> dict[str, bytes]:
    """Every initializer's bytes, external data read by onnx."""
    m = onnx.load(path)
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in m.graph.initializer}


@pytest.mark.parametrize("algo", ["awq_lite", "awq_clip", "awq_full", "gptq", "awq_gptq"])
def test_layer_by_layer_equals_whole_model(nibble, llama, algo):
    spec, path, npz, root = llama
    whole = os.path.join(root, f"whole_{algo}", "model.onnx")
    layered = os.path.join(root, f"layered_{algo}", "model.onnx")
    nibble.quantize(path, whole, "--algo", algo, "--layer_by_layer", "off", *calib_args(npz))
    r = nibble.quantize(path, layered, "--algo", algo, "--layer_by_layer", *calib_args(npz))
    assert "layer group 3:" in r.stderr, r.describe()
    a, b = initializers(whole), initializers(layered)
    assert sorted(a) == sorted(b)
    differ = [n for n in a if a[n] != b[n]]
    assert differ == [], differ
    na = [(n.op_type, list(n.input), list(n.output)) for n in onnx.load(whole, load_external_data=False).graph.node]
    nb = [(n.op_type, list(n.input), list(n.output)) for n in onnx.load(layered, load_external_data=False).graph.node]
    assert na == nb
    # the state folder goes once the output is committed
    assert not os.path.exists(os.path.join(os.path.dirname(layered), ".model.onnx.layers"))


def kill_after_layers(nibble, path, out, args, at_least: int) -> int:
    """Starts `nibble quantize` into `out` and SIGKILLs it once its checkpoint records `at_least`
    finished layer groups; returns how many it had finished."""
    ckpt = out.parent / f".{out.name}.layers" / "checkpoint.json"
    cmd = [nibble.binary, "quantize", "--onnx_path", path, "--output_path", str(out), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = 0
    deadline = time.time() + 300
    while p.poll() is None and time.time() < deadline:
        try:
            done = json.loads(ckpt.read_text())["layers_done"]
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= at_least:
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    p.wait()
    assert p.returncode == -signal.SIGKILL, "the run ended before it could be killed mid-way"
    assert at_least <= done < LAYERS
    assert not out.exists()
    return done


def test_resume_after_sigkill_is_byte_identical(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    args = ["--algo", "awq_lite", "--layer_by_layer", *calib_args(npz)]
    straight = tmp_path / "straight" / "model.onnx"
    nibble.quantize(path, str(straight), *args)

    out = tmp_path / "killed" / "model.onnx"
    done = kill_after_layers(nibble, path, out, args, 2)

    r = nibble.quantize(path, str(out), *args, "--resume")
    assert f"continuing at layer group {done}" in r.stderr, r.describe()
    for k in range(done):  # finished layers are not computed again
        assert f"layer group {k}:" not in r.stderr, r.describe()
    assert folder_digest(str(out.parent)) == folder_digest(str(straight.parent))


def resume_over_stale_state(nibble, llama, tmp_path, name, state, *flags):
    """--resume of tmp_path/m.onnx where the state folder holds only `name` = `state` (other flags)."""
    spec, path, npz, root = llama
    folder = tmp_path / ".m.onnx.layers"
    folder.mkdir()
    (folder / name).write_text(json.dumps(state))
    return nibble.quantize(path, str(tmp_path / "m.onnx"), *flags, "--layer_by_layer", "--resume", *calib_args(npz),
                           check=False)


def test_resume_with_other_flags_refused(nibble, llama, tmp_path):
    r = resume_over_stale_state(nibble, llama, tmp_path, "checkpoint.json",
                                {"settings": {"algo": "other"}, "layers_done": 1}, "--algo", "awq_lite")
    assert r.returncode != 0
    assert "written with other flags" in r.stderr.strip().splitlines()[-1]


def test_resume_needs_layer_by_layer(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), "--resume", "--layer_by_layer", "off", *calib_args(npz),
                        check=False)
    assert r.returncode != 0 and "--resume continues a --layer_by_layer run" in r.stderr
    # auto that takes the whole-model pass refuses it too, saying why
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), "--resume", "--awq_mode", "modelopt", *calib_args(npz),
                        check=False)
    assert r.returncode != 0 and "--resume continues a --layer_by_layer run" in r.stderr
    assert "--awq_mode modelopt" in r.stderr.strip().splitlines()[-1]


def test_uncuttable_graph_falls_back(nibble, model_cache, tmp_path):
    spec, path = model_cache.gemm()
    rng = np.random.default_rng(3)
    npz = str(tmp_path / "c.npz")
    np.savez(npz, x=rng.standard_normal((4, 7, spec.hidden)).astype(np.float32))
    r = nibble.quantize(path, str(tmp_path / "o" / "m.onnx"), "--algo", "awq_lite", "--layer_by_layer",
                        "--calib_data", npz, "--calib_size", "4", "--calibration_eps", "cpu", check=False)
    assert "cannot be cut into layers" in r.stderr, r.describe()


def test_rtn_says_layer_by_layer_has_no_effect(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), "--algo", "rtn_dq", "--layer_by_layer")
    assert "--layer_by_layer: no effect" in r.stderr


def test_feed_quantized(nibble, llama, tmp_path):
    """Layer 0 sees the float inputs either way, so its weights equal the float-fed run's; later layers
    are calibrated on the quantized layers' outputs, so some of their choices differ; the model runs."""
    spec, path, npz, root = llama
    fed = tmp_path / "fed" / "model.onnx"
    plain = tmp_path / "plain" / "model.onnx"
    engine = ("--calibration_engine", "ort")  # ONNX Runtime's feed (the layer engine's: test_engine_calibration)
    nibble.quantize(path, str(plain), "--algo", "awq_lite", "--layer_by_layer", *engine, *calib_args(npz))
    r = nibble.quantize(path, str(fed), "--algo", "awq_lite", "--layer_by_layer", "--feed_quantized", *engine,
                        *calib_args(npz))
    assert "run dequantized" in r.stderr, r.describe()
    a, b = initializers(str(plain)), initializers(str(fed))
    layer0 = [n for n in a if ".layers.0." in n and "down_proj" not in n]
    assert layer0 and all(a[n] == b[n] for n in layer0)
    later = [n for n in a if ".layers.0." not in n and a[n] != b[n]]
    assert later, "feeding the quantized layers forward changed nothing"
    import onnxruntime as ort
    x = models.llama_inputs(spec)
    out = ort.InferenceSession(str(fed), providers=["CPUExecutionProvider"]).run(None, x)[0]
    assert np.isfinite(out).all()


def test_feed_quantized_needs_layer_by_layer(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), "--feed_quantized", "--layer_by_layer", "off",
                        *calib_args(npz), check=False)
    assert r.returncode != 0 and "--feed_quantized" in r.stderr.strip().splitlines()[-1]


def state_files(folder) -> dict[str, bytes]:
    """A state folder's files and bytes, but the lock (it holds the pid of the last run that took it)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "lock"}


def test_rerun_without_resume_refuses_and_keeps_the_state(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    args = ["--algo", "awq_lite", "--layer_by_layer", *calib_args(npz)]
    out = tmp_path / "model.onnx"
    done = kill_after_layers(nibble, path, out, args, 1)
    state = tmp_path / ".model.onnx.layers"
    before = state_files(state)
    r = nibble.quantize(path, str(out), *args, check=False)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"a run stopped after {done} of {LAYERS} layer groups left its state in {state}: "
        "--resume continues it, --force starts over"), r.describe()
    assert state_files(state) == before  # nothing deleted, nothing written
    r = nibble.quantize(path, str(out), *args, "--resume")
    assert f"continuing at layer group {done}" in r.stderr, r.describe()
    assert not state.exists()


def test_force_starts_over(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    args = ["--algo", "awq_lite", "--layer_by_layer", *calib_args(npz)]
    out = tmp_path / "model.onnx"
    kill_after_layers(nibble, path, out, args, 1)
    r = nibble.quantize(path, str(out), *args, "--force")
    assert "continuing at layer group" not in r.stderr and "layer group 0:" in r.stderr, r.describe()
    assert not (tmp_path / ".model.onnx.layers").exists()


def test_resume_with_another_model_at_the_same_path_is_refused(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    model = tmp_path / "in" / "model.onnx"
    model.parent.mkdir()
    m = onnx.load(path)  # the test model, its weights inline in our own copy
    onnx.save(m, str(model))
    args = ["--algo", "awq_lite", "--layer_by_layer", *calib_args(npz)]
    out = tmp_path / "out" / "model.onnx"
    kill_after_layers(nibble, str(model), out, args, 1)
    # Re-exported at the same path: one weight changed.
    init = next(t for t in m.graph.initializer if len(onnx.numpy_helper.to_array(t).shape) == 2)
    arr = onnx.numpy_helper.to_array(init).copy()
    arr[0, 0] += 1.0
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    onnx.save(m, str(model))
    state = out.parent / ".model.onnx.layers"
    before = state_files(state)
    r = nibble.quantize(str(model), str(out), *args, "--resume", check=False)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"--resume: the model, its data or the calibration files differ from those of the stopped run in {state}: "
        "--force starts over"), r.describe()
    assert state_files(state) == before


def test_second_run_on_a_live_runs_output_refuses(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    args = ["--algo", "awq_lite", "--layer_by_layer", *calib_args(npz)]
    out = tmp_path / "model.onnx"
    lock = tmp_path / ".model.onnx.layers" / "lock"
    cmd = [nibble.binary, "quantize", "--onnx_path", path, "--output_path", str(out), *args]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while first.poll() is None and time.time() < deadline:
            if lock.exists() and lock.read_text().strip() == str(first.pid):
                break
            time.sleep(0.005)
        assert first.poll() is None, "the first run ended before the second could start"
        r = nibble.quantize(path, str(out), *args, check=False)
        assert r.returncode != 0
        assert r.stderr.strip().splitlines()[-1].endswith(
            f"another nibble run (pid {first.pid}) is using the layer state {lock.parent}: wait for it to finish or "
            "give another --output_path"), r.describe()
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0  # the first run was not disturbed
    assert out.exists() and not lock.parent.exists()


def report_of(path) -> dict:
    with open(path) as f:
        return json.load(f)


def pass_line(stderr: str) -> str:
    """The one line that says which pass the run takes."""
    lines = [l for l in stderr.splitlines() if "info layer by layer:" in l or "info the whole-model pass:" in l]
    assert len(lines) == 1, stderr
    return lines[0]


def test_default_goes_layer_by_layer_and_off_forces_whole_model(nibble, llama, tmp_path):
    """With every flag at its default a calibrated run on a cuttable graph goes layer by layer, and its
    fp32 codes equal those of --layer_by_layer off (the whole-model pass)."""
    spec, path, npz, root = llama
    auto, off = tmp_path / "auto" / "m.onnx", tmp_path / "off" / "m.onnx"
    r = nibble.quantize(path, str(auto), *calib_args(npz), "--report", str(tmp_path / "auto.json"))
    assert f"layer by layer: {LAYERS} layer groups (--layer_by_layer auto" in pass_line(r.stderr)
    assert f"layer group {LAYERS - 1}:" in r.stderr, r.describe()
    rep = report_of(tmp_path / "auto.json")
    assert rep["options"]["layer_by_layer"] == "auto"
    assert rep["summary"]["layer_pass"]["mode"] == "layer_by_layer"
    assert rep["summary"]["layer_pass"]["layer_groups"] == LAYERS

    r = nibble.quantize(path, str(off), *calib_args(npz), "--layer_by_layer", "off",
                        "--report", str(tmp_path / "off.json"))
    assert "the whole-model pass: --layer_by_layer off" in pass_line(r.stderr)
    assert "layer group" not in r.stderr
    rep = report_of(tmp_path / "off.json")
    assert rep["summary"]["layer_pass"] == {"mode": "whole_model", "layer_groups": 0, "why": "--layer_by_layer off"}
    a, b = initializers(str(auto)), initializers(str(off))
    assert sorted(a) == sorted(b) and [n for n in a if a[n] != b[n]] == []


@pytest.mark.parametrize("spelling", [["--layer_by_layer"], ["--layer_by_layer=on"], ["--layer_by_layer", "on"],
                                      ["--config", "PRESET"]])
def test_old_boolean_spelling_is_on(nibble, llama, tmp_path, spelling):
    """--layer_by_layer alone (the old boolean flag, here followed by another flag) still means on, and so
    does a preset's `layer_by_layer = true`."""
    spec, path, npz, root = llama
    (tmp_path / "preset.toml").write_text("layer_by_layer = true\n")
    spelling = [str(tmp_path / "preset.toml") if a == "PRESET" else a for a in spelling]
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), *spelling, "--algo", "rtn_dq",
                        "--report", str(tmp_path / "r.json"))
    assert report_of(tmp_path / "r.json")["options"]["layer_by_layer"] == "on"
    assert "--layer_by_layer: no effect: --algo rtn_dq runs no calibration" in r.stderr


def test_bad_layer_mode_is_one_line(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), "--layer_by_layer", "sometimes", check=False)
    assert r.returncode != 0
    assert r.stderr.strip() == "nibble: error: --layer_by_layer sometimes is unknown (choose auto, on or off)"


def test_default_on_uncuttable_graph_is_whole_model(nibble, model_cache, tmp_path):
    spec, path = model_cache.gemm()
    rng = np.random.default_rng(3)
    npz = str(tmp_path / "c.npz")
    np.savez(npz, x=rng.standard_normal((28, spec.hidden)).astype(np.float32))
    r = nibble.quantize(path, str(tmp_path / "o" / "m.onnx"), "--algo", "awq_lite", "--calib_data", npz,
                        "--calib_size", "4", "--calibration_eps", "cpu", "--report", str(tmp_path / "r.json"))
    line = pass_line(r.stderr)
    assert "the whole-model pass: the graph cannot be cut into layers (the node names number fewer than two" in line
    assert "--layer_by_layer:" not in r.stderr  # auto was not asked for layers: no warning
    rep = report_of(tmp_path / "r.json")["summary"]["layer_pass"]
    assert rep["mode"] == "whole_model" and rep["why"].startswith("the graph cannot be cut into layers")


@pytest.mark.parametrize("flags,why", [
    (["--awq_mode", "modelopt"], "--awq_mode modelopt keeps ModelOpt's whole-model calibration"),
    (["--algo", "rtn_dq"], "--algo rtn_dq runs no calibration"),
    (["--algo", "hqq"], "--algo hqq runs no calibration"),
    (["--calib_cache", "CACHE"], "a statistics cache is given (its entries are the whole model's statistics"),
])
def test_auto_takes_whole_model_pass_where_layers_do_not_fit(nibble, llama, tmp_path, flags, why):
    spec, path, npz, root = llama
    flags = [str(tmp_path / "cache") if f == "CACHE" else f for f in flags]
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), *flags, *calib_args(npz), "--report", str(tmp_path / "r.json"))
    assert f"the whole-model pass: {why}" in pass_line(r.stderr), r.describe()
    assert "layer group" not in r.stderr and "--layer_by_layer:" not in r.stderr, r.describe()
    rep = report_of(tmp_path / "r.json")["summary"]["layer_pass"]
    assert rep["mode"] == "whole_model" and rep["why"].startswith(why)


def test_default_run_failing_in_calibration_leaves_nothing(nibble, llama, tmp_path):
    """Bad calibration input fails a layer-by-layer run in its first layer: one error line, and no state
    folder (nothing was finished, so nothing to resume)."""
    spec, path, npz, root = llama
    out = tmp_path / "o" / "m.onnx"
    r = nibble.quantize(path, str(out), "--calib_size", "2", "--calibration_eps", "cpu", check=False)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [r.stderr.strip().splitlines()[-1]], r.describe()
    assert "has no input_ids input" in r.stderr
    assert os.listdir(out.parent) == []


def test_one_calibration_process_serves_every_layer(nibble, llama, tmp_path, monkeypatch):
    """Layer by layer, one calib/capture.py (its `serve` mode) measures every layer group: the report
    counts one process where NIBBLE_CALIB_SERVER=0 starts one per group, and the output bytes are the same."""
    spec, path, npz, root = llama
    outs = {}
    for server in ("1", "0"):
        monkeypatch.setenv("NIBBLE_CALIB_SERVER", server)
        out = str(tmp_path / f"server{server}" / "model.onnx")
        rep = str(tmp_path / f"server{server}.json")
        r = nibble.quantize(path, out, "--algo", "awq_lite", "--layer_by_layer", "--report", rep,
                            "--calibration_engine", "ort", *calib_args(npz))
        summary = json.load(open(rep))["summary"]
        assert summary["layer_pass"]["mode"] == "layer_by_layer", r.describe()
        outs[server] = (initializers(out), summary["calibration_processes"])
    assert outs["1"][1] == 1
    assert outs["0"][1] >= LAYERS, outs["0"][1]   # a child per layer group
    assert outs["1"][0] == outs["0"][0]


def test_next_group_is_calibrated_beside_the_search(nibble, llama, tmp_path):
    """With the float layers fed forward, group g + 1 is measured while group g is searched (the log says
    so for every group but the first); --threads 1 measures each group in turn; the bytes are the same."""
    spec, path, npz, root = llama
    got = {}
    for threads in ("0", "1"):
        out = str(tmp_path / f"t{threads}" / "model.onnx")
        r = nibble.quantize(path, out, "--algo", "awq_lite", "--layer_by_layer", "--threads", threads,
                            "--verbose", *calib_args(npz))
        beside = [ln for ln in r.stderr.splitlines() if "measured beside the previous group" in ln]
        assert len(beside) == (LAYERS - 1 if threads == "0" else 0), r.describe()
        assert "layer group 0:" in r.stderr and not any("layer group 0:" in ln for ln in beside)
        got[threads] = initializers(out)
    assert got["0"] == got["1"]


@pytest.mark.parametrize("dies", ["at_start", "mid_request"])
def test_calibration_process_that_dies_is_one_error_line(nibble, llama, tmp_path, monkeypatch, dies):
    """The calibration process ending (a Python without nibble's packages, or killed in a request) is one
    error line and a non-zero exit, never a hang, and leaves no output."""
    spec, path, npz, root = llama
    fake = tmp_path / "python"
    if dies == "at_start":
        fake.write_text('#!/bin/sh\necho "calibration: this Python lacks numpy" >&2\nexit 2\n')
    else:  # serves nothing: reads the first request, then dies of a signal
        fake.write_text("#!/bin/sh\nread line\necho 'calib: got a request' >&2\nkill -9 $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NIBBLE_PYTHON", str(fake))
    out = tmp_path / "out" / "model.onnx"
    r = nibble.quantize(path, str(out), "--algo", "awq_lite", "--layer_by_layer", *calib_args(npz), check=False)
    assert r.returncode != 0, r.describe()
    want = "this Python lacks numpy" if dies == "at_start" else "signal 9"
    assert want in r.stderr, r.describe()
    assert not out.exists()


def test_calibrate_first_writes_the_same_bytes(nibble, llama, tmp_path):
    """Each group calibrated just before its search measures what calibrating it beside the previous
    group's search does: the same model bytes, on the layer engine and on ONNX Runtime; the report keeps the
    flag, and the whole-model pass says it has no effect."""
    spec, path, npz, root = llama
    for engine in ("native", "ort"):
        beside = tmp_path / engine / "beside" / "model.onnx"
        first = tmp_path / engine / "first" / "model.onnx"
        flags = ("--algo", "awq_lite", "--layer_by_layer", "--calibration_engine", engine, *calib_args(npz))
        r = nibble.quantize(path, str(beside), *flags)
        assert "measured beside the previous group" in r.stderr, r.describe()
        report = tmp_path / engine / "r.json"
        r = nibble.quantize(path, str(first), *flags, "--calibrate_first", "--report", str(report))
        assert "--calibrate_first: no effect" not in r.stderr
        assert "measured beside the previous group" not in r.stderr, r.describe()
        assert json.loads(report.read_text())["options"]["calibrate_first"] is True
        assert beside.read_bytes() == first.read_bytes(), engine
        a, b = (p.with_name(p.name + ".data") for p in (beside, first))
        assert not a.exists() or a.read_bytes() == b.read_bytes()
    r = nibble.quantize(path, str(tmp_path / "whole.onnx"), "--algo", "awq_lite", "--layer_by_layer", "off",
                        "--calibrate_first", *calib_args(npz))
    assert "--calibrate_first: no effect in the whole-model pass" in r.stderr

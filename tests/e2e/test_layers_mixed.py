"""Mixed INT4/INT8 precision with --layer_by_layer.

* The static choices (--enable_mixed_quant's ModelOpt choice, --layers_8bit) are made from node names
  before any layer runs: every output initializer equals the whole-model run's.
* --mixed_strategy sensitivity: a first sweep measures each layer's weights at 4 and 8 bits (the float
  layers fed forward), the greedy pick runs once on every weight's errors, a second sweep quantizes. The
  INT8 set and every output initializer equal the whole-model run's: on a 4-layer Llama-shaped test model
  (awq_lite, awq_full, gptq, rtn_dq), on a tools/make_llama_shaped.py model (awq_lite) and on SmolLM2-135M
  fp32 (awq_lite, rtn_dq) when it is there.
* --resume after a SIGKILL in the first sweep and in the second gives the same bytes as a run never
  stopped, and measures no finished layer again.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import onnx
import pytest

from .conftest import REPO, folder_digest
from .test_layers import (LAYERS, SAMPLES, SEQ, calib_args, initializers, llama,  # noqa: F401 (llama: a fixture)
                          resume_over_stale_state)

SMOLLM2 = "/work/golden/smollm2-fp32/model.onnx"
SMOLLM2_CALIB = "/work/golden/calib_fp32.npz"


def run(nibble, src: str, out: str, *flags: str):
    """Quantizes with a report; returns (result, {weight: its report entry})."""
    rep = out + ".json"
    # SmolLM2 layer by layer: two sweeps of 30 layers, each layer one ONNX Runtime session (minutes)
    r = nibble.run("quantize", "--onnx_path", src, "--output_path", out, *flags, "--report", rep, timeout=1800)
    assert r.returncode == 0, r.describe()
    with open(rep, encoding="utf-8") as f:
        return r, {w["name"]: w for w in json.load(f)["weights"]}


def int8(weights: dict) -> set[str]:
    return {n for n, w in weights.items() if w["bits"] == 8}


def same_as_whole_model(nibble, src: str, root: str, name: str, *flags: str) -> tuple[set[str], object]:
    """Runs whole-model and layer by layer; asserts equal INT8 sets, initializers and nodes."""
    whole, layered = os.path.join(root, f"whole_{name}", "model.onnx"), os.path.join(root, f"layered_{name}", "model.onnx")
    _, wa = run(nibble, src, whole, *flags)
    r, wb = run(nibble, src, layered, *flags, "--layer_by_layer")
    assert "layer group 1:" in r.stderr, r.describe()
    assert int8(wa) == int8(wb)
    a, b = initializers(whole), initializers(layered)
    assert sorted(a) == sorted(b)
    differ = [n for n in a if a[n] != b[n]]
    assert differ == [], differ
    na = [(n.op_type, list(n.input)) for n in onnx.load(whole, load_external_data=False).graph.node]
    nb = [(n.op_type, list(n.input)) for n in onnx.load(layered, load_external_data=False).graph.node]
    assert na == nb
    meta = [{p.key: p.value for p in onnx.load(m, load_external_data=False).metadata_props} for m in (whole, layered)]
    assert meta[0] == meta[1]
    assert not os.path.exists(os.path.join(os.path.dirname(layered), ".model.onnx.layers"))
    return int8(wa), r


@pytest.mark.parametrize("flags", [["--enable_mixed_quant"], ["--layers_8bit", "layers.1,mlp/down_proj"]],
                         ids=["modelopt", "layers_8bit"])
def test_static_mixed_layer_by_layer(nibble, llama, flags):
    spec, path, npz, root = llama
    chosen, _ = same_as_whole_model(nibble, path, root, flags[0].strip("-"), "--algo", "awq_lite", *flags,
                                    *calib_args(npz))
    assert chosen and len(chosen) < 5 * LAYERS, chosen


@pytest.mark.parametrize("algo", ["awq_lite", "awq_full", "gptq", "rtn_dq", "hqq"])
def test_sensitivity_layer_by_layer_equals_whole_model(nibble, llama, algo):
    spec, path, npz, root = llama
    fmt = ["--format", "matmulnbits"] if algo == "hqq" else []  # hqq: float zero points at 4 bits
    chosen, r = same_as_whole_model(nibble, path, root, f"sens_{algo}", "--algo", algo, *fmt, "--mixed_strategy",
                                    "sensitivity", "--mixed_budget", "0.3", *calib_args(npz))
    assert chosen and len(chosen) < 5 * LAYERS, chosen
    assert "sensitivity sweep: layer group 3:" in r.stderr, r.describe()
    assert "ranks every weight" not in r.stderr


@pytest.mark.skipif(not (os.path.isfile(SMOLLM2) and os.path.isfile(SMOLLM2_CALIB)), reason="SmolLM2-135M fp32 absent")
@pytest.mark.parametrize("algo", ["awq_lite", "rtn_dq"])
def test_sensitivity_smollm2_equals_whole_model(nibble, tmp_path, algo):
    """Real weights (a dequantized Q4_1 GGUF); the default budget (the size of ModelOpt's choice)."""
    chosen, _ = same_as_whole_model(nibble, SMOLLM2, str(tmp_path), algo, "--algo", algo, "--mixed_strategy",
                                    "sensitivity", "--calib_data", SMOLLM2_CALIB, "--calib_size", "8")
    assert 0 < len(chosen) < 211, len(chosen)


def test_sensitivity_llama_shaped_equals_whole_model(nibble, tmp_path):
    """tools/make_llama_shaped.py (ORT-GenAI names, fp32 so that the cut changes no rounding), random token
    ids; the default budget (the size of ModelOpt's choice)."""
    src = str(tmp_path / "src" / "model.onnx")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_llama_shaped.py"), "--out", src, "--hidden", "256",
                    "--intermediate", "688", "--layers", "4", "--vocab", "1000", "--heads", "4", "--dtype", "fp32",
                    "--quiet"], check=True, timeout=300)
    chosen, _ = same_as_whole_model(nibble, src, str(tmp_path), "shaped", "--algo", "awq_lite", "--mixed_strategy",
                                    "sensitivity", "--use_random_calib", "--calib_size", "4", "--calib_seq_len", "32",
                                    "--calibration_eps", "cpu")
    assert 0 < len(chosen) < 5 * 4, chosen


def kill_when(cmd: list[str], ready) -> None:
    """Starts cmd and SIGKILLs it as soon as ready() is true."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while p.poll() is None and time.time() < deadline:
        if ready():
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    p.wait()
    assert p.returncode == -signal.SIGKILL, "the run ended before it could be killed mid-way"


@pytest.mark.parametrize("when", ["first_sweep", "second_sweep"])
def test_resume_after_sigkill_is_byte_identical(nibble, llama, tmp_path, when):
    spec, path, npz, root = llama
    args = ["--algo", "awq_lite", "--mixed_strategy", "sensitivity", "--mixed_budget", "0.3", "--layer_by_layer",
            *calib_args(npz)]
    straight = tmp_path / "straight" / "model.onnx"
    nibble.quantize(path, str(straight), *args)

    out = tmp_path / "killed" / "model.onnx"
    state = tmp_path / "killed" / ".model.onnx.layers"

    def layers_done() -> int:
        try:
            return json.loads((state / "checkpoint.json").read_text())["layers_done"]
        except (OSError, ValueError, KeyError):
            return 0

    if when == "first_sweep":
        kill_when([nibble.binary, "quantize", "--onnx_path", path, "--output_path", str(out), *args],
                  lambda: (state / "sensitivity_1.json").exists())
        measured = sorted(p.name for p in state.glob("sensitivity_*.json"))
        assert 2 <= len(measured) < LAYERS and not (state / "mixed.json").exists(), measured
    else:
        kill_when([nibble.binary, "quantize", "--onnx_path", path, "--output_path", str(out), *args],
                  lambda: layers_done() >= 2)
        done = layers_done()
        assert 2 <= done < LAYERS
    assert not out.exists()

    r = nibble.quantize(path, str(out), *args, "--resume")
    if when == "first_sweep":
        for k in range(len(measured)):  # measured layers are not measured again
            assert f"sensitivity sweep: layer group {k} was measured" in r.stderr, r.describe()
            assert f"sensitivity sweep: layer group {k}:" not in r.stderr, r.describe()
        assert f"sensitivity sweep: layer group {LAYERS - 1}:" in r.stderr, r.describe()
    else:
        assert "the INT8 choice of the stopped run" in r.stderr, r.describe()
        assert "sensitivity sweep: layer group" not in r.stderr, r.describe()
        assert f"continuing at layer group {done}" in r.stderr, r.describe()
    assert folder_digest(str(out.parent)) == folder_digest(str(straight.parent))


def test_resume_second_sweep_without_calibration(nibble, tmp_path):
    """hqq in MatMulNBits (float zero points) with sensitivity: the second sweep calibrates nothing, so the
    resumed run lays the finished layers out again from the checkpoint alone. A 6-layer fp16 model big enough
    (H=768) that the second sweep can be stopped mid-way."""
    src = str(tmp_path / "src" / "model.onnx")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "make_llama_shaped.py"), "--out", src, "--hidden", "768",
                    "--intermediate", "2048", "--layers", "6", "--vocab", "1000", "--heads", "12", "--dtype", "fp16",
                    "--quiet"], check=True, timeout=300)
    args = ["--algo", "hqq", "--format", "matmulnbits", "--mixed_strategy", "sensitivity", "--mixed_budget", "0.3",
            "--layer_by_layer", "--use_random_calib", "--calib_size", "2", "--calib_seq_len", "16",
            "--calibration_eps", "cpu", "--threads", "1"]
    straight = tmp_path / "straight" / "model.onnx"
    nibble.quantize(src, str(straight), *args)
    out = tmp_path / "killed" / "model.onnx"
    checkpoint = tmp_path / "killed" / ".model.onnx.layers" / "checkpoint.json"

    def layers_done() -> int:
        try:
            return json.loads(checkpoint.read_text())["layers_done"]
        except (OSError, ValueError, KeyError):
            return 0

    kill_when([nibble.binary, "quantize", "--onnx_path", src, "--output_path", str(out), *args],
              lambda: layers_done() >= 2)
    done = layers_done()
    assert 2 <= done < 6
    r = nibble.quantize(src, str(out), *args, "--resume")
    assert f"continuing at layer group {done}" in r.stderr, r.describe()
    assert folder_digest(str(out.parent)) == folder_digest(str(straight.parent))


def test_resume_sweep_with_other_flags_refused(nibble, llama, tmp_path):
    r = resume_over_stale_state(nibble, llama, tmp_path, "sensitivity_0.json",
                                {"settings": {"algo": "other"}, "errors": {}}, "--algo", "awq_lite",
                                "--mixed_strategy", "sensitivity")
    assert r.returncode != 0
    assert "written with other flags" in r.stderr.strip().splitlines()[-1]


def test_rtn_feed_quantized_says_no_effect(nibble, llama, tmp_path):
    spec, path, npz, root = llama
    r = nibble.quantize(path, str(tmp_path / "m.onnx"), "--algo", "rtn_dq", "--mixed_strategy", "sensitivity",
                        "--mixed_budget", "0.3", "--layer_by_layer", "--feed_quantized", *calib_args(npz))
    assert "--feed_quantized: no effect" in r.stderr, r.describe()

"""Calibration on nibble's layer engine (`--calibration_engine native`): layer by layer it gives the same
bytes as the engine's whole-model pass (awq_lite, awq_clip's diagonal blocks, gptq); the report says which
engine ran and where its time went; on SmolLM2-135M its codes are near ONNX Runtime's (the statistics differ by float32 summation
order only: bench/engine_side_by_side.sh measures the perplexity); and the flags it cannot honour are refused
in one line."""
import json
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from . import models
from .conftest import REPO, folder_digest, smollm2_dir

FAST = ["--algo", "awq_lite", "--use_random_calib", "--calib_size", "4", "--calib_seq_len", "64",
        "--awqlite_alpha_step", "0.5", "--quiet"]


@pytest.fixture(scope="module")
def smollm2() -> str:
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import smollm2_to_onnx as conv
    return os.path.join(smollm2_dir(conv, "fp32"), "model.onnx")


def codes(path: str) -> dict:
    m = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


@pytest.fixture(scope="module")
def llama(model_cache, tmp_path_factory):
    spec, path = model_cache.llama(layers=3)
    npz = str(tmp_path_factory.mktemp("engine") / "calib.npz")
    np.savez(npz, hidden=np.random.default_rng(5).standard_normal((6, 16, spec.hidden)).astype(np.float32))
    return path, ["--calib_data", npz, "--calib_size", "6", "--block_size", "32", "--quiet"]


@pytest.mark.parametrize("algo", ["awq_lite", "awq_clip", "gptq"])  # the whole Gram, its diagonal blocks
def test_layer_by_layer_equals_the_whole_model_pass_and_the_report_names_the_engine(nibble, llama, tmp_path, algo):
    path, calib = llama
    outs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode / "model.onnx"
        rep = tmp_path / f"{mode}.json"
        nibble.quantize(path, str(out), "--algo", algo, *calib, "--calibration_engine", "native",
                        "--layer_by_layer", mode, "--report", str(rep))
        r = json.loads(rep.read_text())
        assert r["stages"]["calibrate"] == "nibble layer engine (forward: cpu, statistics: cpu)"
        assert r["options"]["calibration_engine"] == "native"
        eng = r["summary"]["calibration_engine"]
        assert eng["engine"] == "native" and eng["forward_seconds"] > 0 and eng["statistics_seconds"] > 0
        assert r["summary"]["calibration_processes"] == 1  # capture.py once, for the feeds
        assert r["summary"]["layer_pass"]["mode"] == ("layer_by_layer" if mode == "on" else "whole_model")
        outs[mode] = codes(str(out))
    assert outs["on"].keys() == outs["off"].keys()
    for k in outs["on"]:
        assert np.array_equal(outs["on"][k], outs["off"][k]), k


# slow: SmolLM2 quantized twice (two minutes under the sanitizers); the engine's forward on SmolLM2 runs there
# in test_forward.py, its calibration in this file's smaller runs.
@pytest.mark.slow
def test_codes_are_near_onnx_runtimes(nibble, smollm2, tmp_path):
    got = {}
    for engine in ("ort", "native"):
        out = tmp_path / engine / "model.onnx"
        nibble.quantize(smollm2, str(out), *FAST, "--calibration_engine", engine)
        got[engine] = codes(str(out))
    packed = [k for k, v in got["ort"].items() if v.dtype.name in ("int4", "uint4", "int8", "uint8")]
    assert len(packed) == 30 * 5  # qkv, o, gate, up, down per layer
    same = sum(int((got["ort"][k].astype(np.int16) == got["native"][k].astype(np.int16)).sum()) for k in packed)
    total = sum(got["ort"][k].size for k in packed)
    assert same / total > 0.9, f"only {same / total:.3f} of the codes agree"


@pytest.mark.parametrize("flags, message", [
    (["--awq_mode", "modelopt"], "--calibration_engine native: --awq_mode modelopt measures ModelOpt's statistics "
                                 "through ONNX Runtime (use --calibration_engine ort)"),
    (["--feed_quantized", "--resume"], "--calibration_engine native --feed_quantized keeps the quantized layers in "
                                       "memory: a resumed run cannot feed the finished ones forward (use "
                                       "--calibration_engine ort)"),
    (["--calibration_engine", "onnx"], None),
])
def test_flags_the_engine_cannot_honour_are_refused_in_one_line(nibble, smollm2, tmp_path, flags, message):
    out = tmp_path / "o" / "model.onnx"
    args = ["--calibration_engine", "native", *FAST] if flags[0] != "--calibration_engine" else FAST
    r = nibble.quantize(smollm2, str(out), *args, *flags, check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nibble: error: "), r.describe()
    if message:
        assert lines[0] == "nibble: error: " + message
    else:
        assert "--calibration_engine" in lines[0] and "onnx" in lines[0]
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_a_model_with_an_operator_the_engine_does_not_know_is_named(nibble, tmp_path):
    m = models.make_single_matmul(k=128)
    m.graph.node[0].input[0] = "x_celu"
    m.graph.node.insert(0, helper.make_node("Celu", ["x"], ["x_celu"], name="/model/odd/Celu"))
    path = models.save(m, str(tmp_path / "in" / "model.onnx"))
    np.savez(tmp_path / "calib.npz", x=np.ones((2, 128), np.float32))
    before = folder_digest(str(tmp_path / "in"))
    r = nibble.quantize(path, str(tmp_path / "o" / "model.onnx"), "--algo", "awq_lite", "--calib_data",
                        str(tmp_path / "calib.npz"), "--calib_size", "2", "--calibration_engine", "native", check=False)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == (
        f"nibble: error: --calibration_engine native: the layer engine cannot run {path}: Celu at node "
        "'/model/odd/Celu' (--calibration_engine ort runs it)")
    assert folder_digest(str(tmp_path / "in")) == before


def test_the_default_runs_the_engine_and_ort_flags_choose_onnx_runtime(nibble, llama, tmp_path):
    """--calibration_engine auto (the default): the engine, unless a flag names ONNX Runtime's own machinery
    (--calibration_eps); with native, --calibration_eps says in one line that it does nothing."""
    path, calib = llama
    seen = {}
    for name, extra in {"default": [], "eps": ["--calibration_eps", "cpu"],
                        "native_eps": ["--calibration_engine", "native", "--calibration_eps", "cpu"]}.items():
        rep = tmp_path / f"{name}.json"
        r = nibble.quantize(path, str(tmp_path / name / "model.onnx"), "--algo", "awq_lite", *calib[:-1], *extra,
                            "--report", str(rep))
        seen[name] = json.loads(rep.read_text())["summary"]["calibration_engine"], r.stderr
    assert seen["default"][0]["engine"] == "native"
    assert seen["eps"][0] == {"engine": "ort", "why": "--calibration_eps names ONNX Runtime's execution providers"}
    assert seen["native_eps"][0]["engine"] == "native"
    assert ("--calibration_eps cpu: no effect: --calibration_engine native runs the model on nibble's own engine, "
            "on the CPU") in seen["native_eps"][1]
    assert "--calibration_eps" not in seen["default"][1] + seen["eps"][1]


def test_the_flag_is_inert_without_calibration(nibble, smollm2, tmp_path):
    r = nibble.quantize(smollm2, str(tmp_path / "o" / "model.onnx"), "--algo", "rtn_dq", "--calibration_engine",
                        "native")
    assert "--calibration_engine native: no effect: --algo rtn_dq runs no calibration" in r.stderr


def test_an_activation_that_is_a_graph_input_is_measured(nibble, tmp_path):
    """x -> MatMul: the activation is the graph's input itself. One product, no summation order to differ
    in: the native statistics give ONNX Runtime's bytes."""
    path = models.save(models.make_single_matmul(k=128), str(tmp_path / "in" / "model.onnx"))
    npz = str(tmp_path / "calib.npz")
    np.savez(npz, x=np.random.default_rng(1).standard_normal((4, 128)).astype(np.float32))
    got = {}
    for engine in ("ort", "native"):
        out = tmp_path / engine / "model.onnx"
        nibble.quantize(path, str(out), "--algo", "awq_lite", "--calib_data", npz, "--calib_size", "4",
                        "--calibration_engine", engine, "--quiet")
        got[engine] = codes(str(out))
    assert got["ort"].keys() == got["native"].keys() and len(got["ort"]) == 3
    for k in got["ort"]:
        assert np.array_equal(got["ort"][k], got["native"][k]), k


def test_quantized_layers_fed_forward_as_onnx_runtime_feeds_them(nibble, llama, tmp_path):
    """--feed_quantized: each layer measured on the outputs of the layers quantized before it. The engine
    substitutes each quantized weight (dequantized) and runs the previous layer again; its codes are ONNX
    Runtime's but for summation order, and differ from the float-fed run's."""
    path, calib = llama
    got = {}
    for tag, flags in {"ort_fed": ["--calibration_engine", "ort", "--feed_quantized"],
                       "native_fed": ["--calibration_engine", "native", "--feed_quantized"],
                       "native": ["--calibration_engine", "native"]}.items():
        out = tmp_path / tag / "model.onnx"
        nibble.quantize(path, str(out), "--algo", "awq_lite", *calib, *flags)
        got[tag] = codes(str(out))

    def agreement(a, b):
        packed = [k for k, v in got[a].items() if v.dtype.name in ("int4", "uint4")]
        same = sum(int((got[a][k].astype(np.int16) == got[b][k].astype(np.int16)).sum()) for k in packed)
        return same / sum(got[a][k].size for k in packed)
    assert agreement("ort_fed", "native_fed") > 0.999
    assert agreement("native_fed", "native") < agreement("ort_fed", "native_fed")


@pytest.mark.parametrize("form", ["gemma3", "phi3", "qwen2"])
def test_genai_forms_calibrate_on_the_device_as_on_the_cpu(nibble, tmp_path, form):
    """On the emulated device the engine's forward runs the float operators of ONNX Runtime GenAI's layer forms
    there (GroupQueryAttention with a window and softcap, packed qkv with its bias, gate and up sliced apart,
    GELU): only the attention mask's integer arithmetic and the embedding's Gather run on the host (their
    results go up once), and the output is the CPU's byte for byte."""
    from .test_forward import make_genai_like
    (tmp_path / "in").mkdir()
    path = models.save(make_genai_like(form, "fp16"), str(tmp_path / "in" / f"{form}.onnx"))
    digests = {}
    for device in ("cpu", "cuda_emulated"):
        out = tmp_path / device / "model.onnx"
        nibble.quantize(path, str(out), *FAST, "--calibration_engine", "native", "--block_size", "32", "--device",
                        device, "--report", str(tmp_path / device / "report.json"))
        (tmp_path / device / "report.json").rename(tmp_path / f"{device}.json")
        digests[device] = folder_digest(str(out.parent))
    assert digests["cpu"] == digests["cuda_emulated"]
    eng = json.loads((tmp_path / "cuda_emulated.json").read_text())["summary"]["calibration_engine"]
    assert eng["forward_on_device"] and eng["activation_upload_bytes"] > 0
    assert eng["host_operators"] and set(eng["host_operators"]) <= {"ReduceSum", "Sub", "Cast", "Shape", "Gather"}

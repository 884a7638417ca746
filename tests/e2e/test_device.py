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
                                   ("--algo", "rtn", "--format", "matmulnbits"), ("--algo", "gptq"),
                                   ("--algo", "gptq", "--gptq_act_order", "--use_zero_point"),
                                   ("--algo", "awq_gptq")],
                         ids=["rtn_dq", "rtn_dq_zp", "rtn_matmulnbits", "gptq", "gptq_act_order_zp", "awq_gptq"])
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
    assert stages.pop("calibrate", "onnxruntime (cpu)") == "onnxruntime (cpu)"
    assert set(stages.values()) == {"cuda_emulated"}
    s = report["summary"]
    assert s["device_memory_budget_bytes"] == 1 << 30
    assert 0 < s["peak_device_memory_bytes"] <= s["device_memory_budget_bytes"]
    if gptq:  # both GPTQ operations ran on the device, and only awq_scale (libm's powf) on the host
        ops = s["device"]["ops"]
        for op in ("gptq_factor", "gptq_quantize"):
            assert ops[op]["calls"] > 0 and not ops[op]["host_fallback"], ops[op]
        assert set(s["device"]["on_host"]) <= {"awq_scale"}, s["device"]["on_host"]
        assert ops["gptq_quantize"]["d2h_bytes"] <= 1.1 * s["bytes_quantized_out"]
        if flags[1] == "awq_gptq":  # W ⊙ s is read where scale_weight_f32 left it: only O(K) lists go up
            assert ops["gptq_quantize"]["h2d_bytes"] <= ops["gptq_quantize"]["calls"] * (spec.inter + 16) * 4


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


# ---- The transfer ledger (summary.device): what a GPU would move, counted exactly on the emulated device.

LEDGER_KEYS = {"h2d_bytes", "d2h_bytes", "allocations", "launches", "ops", "on_host"}


def _ledger_run(nibble, src, root, npz, *flags):
    out = os.path.join(root, "model.onnx")
    report = os.path.join(root, "r.json")
    calib = ["--calib_data", npz, "--calib_size", "4", "--calibration_eps", "cpu"] if npz else []
    nibble.quantize(src, out, *flags, *calib, "--block_size", "32", "--device", "cuda_emulated", "--report", report,
                    "--force")
    with open(report) as f:
        r = json.load(f)
    s = r["summary"]
    assert LEDGER_KEYS <= set(s["device"]), s["device"].keys()
    return s, s["device"]


@pytest.fixture(scope="module")
def ledger_model(model_cache, tmp_path_factory):
    spec, src = model_cache.llama(dtype="fp16", hidden=128, inter=256)
    npz = str(tmp_path_factory.mktemp("ledger") / "calib.npz")
    np.savez(npz, hidden=np.random.default_rng(3).standard_normal((4, 128, spec.hidden)).astype(np.float16))  # 512 tokens > K: Gram factorisable
    return spec, src, npz


def test_ledger_rtn_moves_each_weight_once_and_packed_codes_back(nibble, model_cache, ledger_model, tmp_path):
    _, src, _ = ledger_model
    s, d = _ledger_run(nibble, src, str(tmp_path / "a"), None, "--algo", "rtn_dq")
    assert d["on_host"] == [] and not d["host_fallback"]
    assert s["bytes_in"] <= d["h2d_bytes"] <= 1.1 * s["bytes_in"]
    assert d["d2h_bytes"] <= 1.1 * s["bytes_quantized_out"]
    # Pooled: a model twice as deep allocates nothing more (no allocation after the first weight of a shape).
    _, deep = model_cache.llama(dtype="fp16", hidden=128, inter=256, layers=4)
    _, d4 = _ledger_run(nibble, deep, str(tmp_path / "b"), None, "--algo", "rtn_dq")
    assert d4["allocations"] == d["allocations"]
    assert d4["ops"]["rtn_lsq"]["calls"] == 2 * d["ops"]["rtn_lsq"]["calls"]


def test_ledger_awq_lite_uploads_each_weight_for_the_search_and_for_the_quantizer(nibble, ledger_model, tmp_path):
    """awq_lite: the search keeps each weight on the device for its statistic and loss (one upload), the
    Cholesky factor never comes back, W ⊙ s is quantized where it was computed. The weight still goes up
    twice (search, then emit), which the whole-model pass's two phases imply."""
    spec, src, npz = ledger_model
    s, d = _ledger_run(nibble, src, str(tmp_path), npz, "--algo", "awq_lite")
    ops, w = d["ops"], s["bytes_in"]
    assert d["on_host"] == ["awq_scale"]  # K values per candidate: libm's powf
    assert ops["keep"]["h2d_bytes"] == w
    assert w <= ops["scale_weight_f32"]["h2d_bytes"] <= 1.02 * w
    # The loss reads the kept weight and factor: only O(K) vectors go up, the 11 candidate scales and the
    # Gram diagonal, K at most `inter`.
    assert ops["awq_losses"]["h2d_bytes"] <= ops["awq_losses"]["calls"] * 12 * spec.inter * 4
    assert ops["awq_weight_mean"]["h2d_bytes"] == 0
    assert ops["gram_cholesky_upper"]["d2h_bytes"] == 0
    assert ops["rtn_weighted"]["h2d_bytes"] < 0.05 * w
    assert d["d2h_bytes"] <= 1.1 * s["bytes_quantized_out"]


def test_ledger_awq_clip_moves_each_weight_once(nibble, ledger_model, tmp_path):
    _, src, npz = ledger_model
    s, d = _ledger_run(nibble, src, str(tmp_path), npz, "--algo", "awq_clip")
    r = json.load(open(str(tmp_path / "r.json")))
    # The statistic each weight reads: its Gram matrix's diagonal blocks (float64), B = 32.
    diag_blocks = sum(-(-wt["shape"][0] // 32) * 32 * 32 * 8 for wt in r["weights"])
    assert d["on_host"] == []
    assert d["h2d_bytes"] <= 1.1 * (s["bytes_in"] + diag_blocks)
    assert d["d2h_bytes"] <= 1.1 * s["bytes_quantized_out"]


def test_ledger_sensitivity_keeps_each_gram_and_weight_once(nibble, ledger_model, tmp_path):
    """Mixed precision by sensitivity measures every weight's loss at 4 and at 8 bits: its activation's
    Gram matrix goes up once for the sibling weights (keep_gram), each weight once for its two losses
    (keep); the losses themselves move only O(K) vectors. The quantizer then uploads each weight again."""
    spec, src, npz = ledger_model
    s, d = _ledger_run(nibble, src, str(tmp_path), npz, "--algo", "rtn_dq", "--mixed_strategy", "sensitivity")
    ops, w = d["ops"], s["bytes_in"]
    H, I = spec.hidden, spec.inter
    grams = ops["keep_gram"]["h2d_bytes"]
    assert ops["keep_gram"]["calls"] <= 4 * spec.layers + 1           # one per activation read by a weight
    assert grams <= (3 * H * H + I * I) * 4 * spec.layers + H * H * 4  # lm_head's input at most besides
    assert ops["keep"]["h2d_bytes"] == w
    assert ops["awq_losses"]["h2d_bytes"] <= ops["awq_losses"]["calls"] * 2 * I * 4
    assert d["h2d_bytes"] <= 2.1 * w + grams

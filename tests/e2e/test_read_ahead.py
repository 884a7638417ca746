"""Weights read ahead from their files (loaders/weight_stream.cc): every quantized weight is read once. On the
CPU the kernels read the memory map itself, each weight's pages mapped ahead by a thread of its own; on a
device each weight is copied by the reader threads into a buffer for its staging. The report says which,
how many bytes, how fast and how long the quantizer waited; the outputs do not depend on it (the CPU and
the emulated device write the same bytes)."""
from __future__ import annotations

import json
import os

import pytest

from .conftest import folder_digest


def _run(nibble, src, root, *flags):
    out = os.path.join(root, "model.onnx")
    report = os.path.join(root, "r.json")
    nibble.quantize(src, out, *flags, "--block_size", "32", "--report", report, "--force")
    with open(report) as f:
        return json.load(f)["summary"], out


@pytest.mark.parametrize("device", ["cpu", "cuda_emulated"])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_every_weight_is_read_once_by_the_readers(nibble, model_cache, tmp_path, threads, device):
    spec, src = model_cache.llama(dtype="fp16", hidden=128, inter=256, layers=3)
    s, _ = _run(nibble, src, str(tmp_path), "--algo", "rtn_dq", "--threads", threads, "--device", device)
    r = s["read"]
    assert r["bytes"] == s["bytes_in"]  # each weight once (no embedding table is quantized here)
    assert r["tensors"] == s["weights_quantized"] == 5 * 3
    assert r["seconds"] > 0 and 0 <= r["wait_seconds"] <= s["seconds"]
    if device == "cpu":  # the map, one thread mapping its pages ahead; the rate is the quantize stage's
        assert r["how"] == "map" and r["threads"] == 1
        rate = r["bytes"] / s["stage_seconds"]["quantize"] / 1e9
    else:  # copied by the readers
        assert r["how"] == "copy" and r["threads"] == int(threads)
        rate = r["bytes"] / r["seconds"] / 1e9
    assert s["read_gbps"] == pytest.approx(rate, rel=1e-9)


def test_read_ahead_feeds_the_device_the_cpus_bytes(nibble, model_cache, tmp_path):
    """The emulated device's uploads (the next weight's prefetch from its read buffer) give the CPU's output,
    byte for byte, and the same bytes read."""
    _, src = model_cache.llama(dtype="fp16", hidden=128, inter=256, layers=3)
    got = {}
    for device in ("cpu", "cuda_emulated"):
        s, out = _run(nibble, src, str(tmp_path / device), "--algo", "rtn_dq", "--device", device)
        got[device] = (folder_digest(os.path.dirname(out)), s["read"]["bytes"], s["read"]["tensors"])
    got = {k: ({f: h for f, h in v[0].items() if f.startswith("model.onnx")}, *v[1:]) for k, v in got.items()}
    assert got["cpu"] == got["cuda_emulated"]


def test_layer_by_layer_reads_each_layers_weights(nibble, model_cache, tmp_path):
    """A calibrated run goes layer by layer: each layer's pass reads its own weights ahead, and the sums are
    the model's."""
    import numpy as np
    spec, src = model_cache.llama(dtype="fp32", hidden=128, inter=256, layers=2)
    npz = str(tmp_path / "calib.npz")
    np.savez(npz, hidden=np.random.default_rng(3).standard_normal((2, 32, spec.hidden)).astype(np.float32))
    s, _ = _run(nibble, src, str(tmp_path / "q"), "--algo", "awq_lite", "--calib_data", npz, "--calib_size", "2",
                "--calibration_eps", "cpu")
    assert s["layer_pass"]["mode"] == "layer_by_layer" and s["layer_pass"]["layer_groups"] == 2
    assert s["read"]["bytes"] == s["bytes_in"]
    assert s["read"]["tensors"] == s["weights_quantized"]

"""`nibble methods`: the method registry as the command line and the Python API read it, checked against
what `nibble quantize` does with each method."""
from __future__ import annotations

import json
import os
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, os.path.join(REPO, "python"))
from nibble import _api  # noqa: E402


@pytest.fixture(scope="module")
def listed(nibble) -> dict[str, dict]:
    r = nibble.run("methods", "--json")
    assert r.returncode == 0, r.describe()
    return {m["name"]: m for m in json.loads(r.stdout)["methods"]}


def test_json_lists_every_algo_once(nibble, listed):
    r = nibble.run("methods", "--json")
    names = [m["name"] for m in json.loads(r.stdout)["methods"]]
    assert len(names) == len(set(names)) == 12, names
    assert set(names) == {"awq_lite", "awq_clip", "awq_full", "rtn", "rtn_dq", "gptq", "awq_gptq", "awq_learned",
                          "rtn_search", "rtn_lsq", "hqq", "awq_learned_layer"}


def test_json_content(listed):
    assert listed["awq_lite"]["calibrates"] and listed["awq_lite"]["measures"] == ["scale_search"]
    assert listed["awq_full"]["measures"] == ["scale_search", "clip_search"]
    assert listed["awq_gptq"]["measures"] == ["scale_search", "gptq"]
    assert not listed["rtn_dq"]["calibrates"] and listed["rtn_dq"]["measures"] == []
    assert not listed["hqq"]["calibrates"]
    assert listed["rtn_dq"]["modelopt"] and listed["rtn_dq"]["modelopt_refusal"] is None
    assert not listed["rtn_lsq"]["modelopt"] and "RTN search" in listed["rtn_lsq"]["modelopt_refusal"]
    assert listed["rtn"]["default_format"] == "qdq" and listed["rtn_dq"]["default_format"] == "dq"
    assert "least squares on 16 levels" in listed["rtn_lsq"]["summary"]
    assert "ONNX Runtime's RTN byte for byte" in listed["rtn_dq"]["summary"]


@pytest.mark.parametrize("algo", ["rtn_lsq", "rtn_search", "gptq", "awq_gptq", "hqq"])
def test_modelopt_refusal_is_the_listed_one(nibble, listed, tmp_path, algo):
    r = nibble.run("quantize", "--onnx_path", str(tmp_path / "in.onnx"), "--output_path", str(tmp_path / "o.onnx"),
                   "--algo", algo, "--awq_mode", "modelopt")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == (f"nibble: error: --algo {algo} --awq_mode modelopt: "
                                                 f"{listed[algo]['modelopt_refusal']}"), r.describe()


def test_help_and_text_list_every_summary(nibble, listed):
    help_text = " ".join(nibble.run("quantize", "--help").stdout.split())
    text = nibble.run("methods").stdout
    for name, m in listed.items():
        assert f"{name}: {m['summary']}" in help_text, name
        assert m["summary"] in text, name


def test_python_api_reads_the_registry(nibble, listed, monkeypatch):
    monkeypatch.setenv("NIBBLE_BIN", os.path.abspath(nibble.binary))
    assert set(_api.calibrated_methods()) == {n for n, m in listed.items() if m["calibrates"]}
    assert _api.calibrates("gptq", {}) and not _api.calibrates("rtn_dq", {})
    assert _api.calibrates("rtn_dq", {"mixed_strategy": "sensitivity"})


def test_json_lists_rounding_and_formats(nibble, listed):
    assert listed["hqq"]["quantizer"] == "hqq" and listed["hqq"]["zero_point"] == "always"
    assert listed["hqq"]["fractional_zero_points"] and listed["hqq"]["zero_point_why"]
    assert listed["rtn_lsq"]["quantizer"] == "rtn_lsq" and listed["rtn_lsq"]["zero_point"] == "refused"
    assert listed["awq_lite"]["quantizer"] == "rtn" and listed["awq_lite"]["zero_point"] == "optional"
    assert [n for n, m in listed.items() if m["learned_rounding"]] == ["awq_learned"]
    assert [n for n, m in listed.items() if m["learns_layers"]] == ["awq_learned_layer"]
    formats = {f["name"]: f for f in json.loads(nibble.run("methods", "--json").stdout)["formats"]}
    assert list(formats) == ["dq", "qdq", "matmulnbits"]
    assert formats["qdq"]["keeps_float_weight"] and not formats["dq"]["keeps_float_weight"]
    assert not formats["matmulnbits"]["needs_opset21"] and formats["dq"]["needs_opset21"]
    assert formats["matmulnbits"]["float_zero_point_bits"] == 4 and formats["dq"]["float_zero_point_bits"] == 0
    help_text = " ".join(nibble.run("quantize", "--help").stdout.split())
    for name, f in formats.items():
        assert f"{name} ({f['summary']})" in help_text, name


@pytest.mark.parametrize("algo", ["rtn_dq", "awq_lite", "rtn_lsq", "hqq", "gptq"])
def test_zero_point_policy_is_what_the_run_says(nibble, listed, tmp_path, algo):
    """refused: --use_zero_point is one error line with the listed reason; always: the run notes it writes zero
    points without the flag; optional: neither (the options are checked before the model is read)."""
    m = listed[algo]
    args = ("quantize", "--onnx_path", str(tmp_path / "in.onnx"), "--output_path", str(tmp_path / "o.onnx"),
            "--algo", algo)
    with_flag = nibble.run(*args, "--use_zero_point")
    without = nibble.run(*args)
    refusal = f"nibble: error: --algo {algo} --use_zero_point: {m['zero_point_why']}"
    note = f"--algo {algo}: writes UINT4/UINT8 codes with zero points ({m['zero_point_why']})"
    assert (with_flag.stderr.strip().splitlines()[-1] == refusal) == (m["zero_point"] == "refused"), \
        with_flag.describe()
    assert (note in without.stderr) == (m["zero_point"] == "always"), without.describe()

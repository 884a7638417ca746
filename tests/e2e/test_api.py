"""nibble.quantize, the Python API with ModelOpt 0.47's signature, run here from the source tree
(python/nibble) over $NIBBLE_BIN: a CalibrationDataReader or a list of feeds gives the same model as
the command line with the same data in an .npz; output_path= leaves the weights on disk; errors are
NibbleError with nibble's one-line message. The installed wheel runs the same in test_wheel.py."""
from __future__ import annotations

import inspect
import os
import sys

import numpy as np
import onnx
import pytest

from . import models
from .conftest import NIBBLE_BIN, REPO, Nibble, data_file, folder_digest

sys.path.insert(0, os.path.join(REPO, "python"))
import nibble as nibble_api  # noqa: E402

SAMPLES, SEQ = 4, 16


class Reader:
    """ONNX Runtime's CalibrationDataReader interface: get_next() gives a feed dict, then None."""

    def __init__(self, feeds: list[dict]):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


@pytest.fixture(autouse=True)
def _binary(monkeypatch):
    monkeypatch.setenv("NIBBLE_BIN", NIBBLE_BIN)


@pytest.fixture(scope="module")
def small(model_cache) -> dict:
    spec, path = model_cache.llama(hidden=64, inter=128, layers=2, vocab=64)
    hidden = models.llama_inputs(spec, batch=SAMPLES, seq=SEQ, seed=5)["hidden"]
    return {"model": path, "hidden": hidden, "feeds": [{"hidden": hidden[i:i + 1]} for i in range(SAMPLES)]}


def test_signature_and_defaults_are_modelopts():
    sig = inspect.signature(nibble_api.quantize)
    expected = {"calibration_method": "awq_lite", "calibration_data_reader": None,
                "calibration_eps": ["cpu", "cuda:0", "trt"], "use_external_data_format": True,
                "use_zero_point": False, "block_size": None, "nodes_to_exclude": [r"/lm_head"],
                "log_level": "INFO", "input_shapes_profile": None, "output_path": None}
    params = list(sig.parameters.values())
    assert params[0].name == "onnx_path" and params[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert {p.name: p.default for p in params[1:-1]} == expected


def test_reader_gives_the_cli_model(small, nibble: Nibble, tmp_path):
    npz = str(tmp_path / "calib.npz")
    np.savez(npz, hidden=small["hidden"])
    nibble.quantize(small["model"], str(tmp_path / "cli" / "model.onnx"), "--algo", "awq_lite", "--block_size", "32",
                    "--calibration_eps", "cpu", "--calib_data", npz, "--calib_size", str(SAMPLES))
    out = str(tmp_path / "api" / "model.onnx")
    m = nibble_api.quantize(small["model"], calibration_method="awq_lite", calibration_data_reader=Reader(small["feeds"]),
                            calibration_eps=["cpu"], block_size=32, output_path=out)
    assert isinstance(m, onnx.ModelProto)
    assert folder_digest(str(tmp_path / "api")) == folder_digest(str(tmp_path / "cli"))
    # Weights left on disk: the returned graph points at out's data file and holds no weight bytes.
    ext = [t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert ext and all(not t.raw_data for t in ext)
    assert {e.value for t in ext for e in t.external_data if e.key == "location"} == {os.path.basename(data_file(out))}
    assert any(n.op_type == "DequantizeLinear" for n in m.graph.node)


def test_list_of_feeds_equals_reader_and_without_output_path_loads_weights(small, tmp_path):
    out = str(tmp_path / "with" / "model.onnx")
    on_disk = nibble_api.quantize(small["model"], calibration_data_reader=Reader(small["feeds"]), block_size=32,
                                  output_path=out, log_level="WARNING")
    in_memory = nibble_api.quantize(small["model"], calibration_data_reader=small["feeds"], block_size=32,
                                    log_level="WARNING")
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in in_memory.graph.initializer)
    onnx.external_data_helper.load_external_data_for_model(on_disk, os.path.dirname(out))
    a = {t.name: onnx.numpy_helper.to_array(t) for t in on_disk.graph.initializer}
    b = {t.name: onnx.numpy_helper.to_array(t) for t in in_memory.graph.initializer}
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_modelproto_input_and_cli_flags_as_kwargs(small, tmp_path):
    model = onnx.load(small["model"])
    m = nibble_api.quantize(model, calibration_method="rtn_dq", block_size=32, nodes_to_exclude=[],
                            format="matmulnbits", log_level="WARNING", output_path=str(tmp_path / "o" / "model.onnx"))
    ops = [n.op_type for n in m.graph.node]
    assert "MatMulNBits" in ops and "MatMul" not in ops  # lm_head quantized too: nothing excluded


def test_error_is_nibbles_one_line(tmp_path):
    missing = str(tmp_path / "nope.onnx")
    with pytest.raises(nibble_api.NibbleError) as e:
        nibble_api.quantize(missing, calibration_method="rtn_dq", log_level="ERROR")
    assert missing in str(e.value) and "\n" not in str(e.value) and not str(e.value).startswith("nibble:")
    assert e.value.returncode != 0


def test_feeds_of_different_shapes_refused(small):
    feeds = [{"hidden": small["hidden"][:1]}, {"hidden": small["hidden"][:1, :8]}]
    with pytest.raises(ValueError, match="same shape past axis 0"):
        nibble_api.quantize(small["model"], calibration_data_reader=feeds)


@pytest.mark.parametrize("method,extra_kw,extra_flags", [
    ("gptq", {}, []),
    ("awq_gptq", {}, []),
    ("rtn_dq", {"mixed_strategy": "sensitivity"}, ["--mixed_strategy", "sensitivity"]),
], ids=["gptq", "awq_gptq", "rtn_dq_sensitivity"])
def test_every_calibrated_method_takes_the_reader(small, nibble: Nibble, tmp_path, method, extra_kw, extra_flags):
    npz = str(tmp_path / "calib.npz")
    np.savez(npz, hidden=small["hidden"])
    nibble.quantize(small["model"], str(tmp_path / "cli" / "model.onnx"), "--algo", method, "--block_size", "32",
                    "--calibration_eps", "cpu", "--calib_data", npz, "--calib_size", str(SAMPLES), *extra_flags)
    report = str(tmp_path / "report.json")
    nibble_api.quantize(small["model"], calibration_method=method, calibration_data_reader=Reader(small["feeds"]),
                        calibration_eps=["cpu"], block_size=32, output_path=str(tmp_path / "api" / "model.onnx"),
                        log_level="WARNING", report=report, **extra_kw)
    assert folder_digest(str(tmp_path / "api")) == folder_digest(str(tmp_path / "cli"))
    import json
    with open(report) as f:
        opts = json.load(f)["options"]
    assert opts["calib_data"].endswith(".npz") and opts["calib_size"] == SAMPLES and not opts["use_random_calib"]


def test_reader_given_to_a_method_that_does_not_calibrate_is_said(small, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="nibble"):
        nibble_api.quantize(small["model"], calibration_method="rtn_dq", calibration_data_reader=small["feeds"],
                            block_size=32, output_path=str(tmp_path / "o" / "model.onnx"), log_level="WARNING")
    lines = [r.getMessage() for r in caplog.records if "calibration_data_reader" in r.getMessage()]
    assert len(lines) == 1 and "rtn_dq does not calibrate" in lines[0], lines


def test_single_file_output(small, tmp_path, monkeypatch):
    out = tmp_path / "o" / "model.onnx"
    m = nibble_api.quantize(small["model"], calibration_method="rtn_dq", block_size=32, output_path=str(out),
                            use_external_data_format=False, log_level="WARNING")
    assert os.listdir(out.parent) == ["model.onnx"]           # one self-contained file, nothing beside it
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in onnx.load(str(out)).graph.initializer)
    assert any(n.op_type == "DequantizeLinear" for n in m.graph.node)
    # Over protobuf's limit (lowered here to 1 KiB: a real one takes a >2 GiB model): refused, and the
    # output folder holds what it held before.
    monkeypatch.setattr(sys.modules["nibble._api"], "PROTO_LIMIT", 1024)
    before = folder_digest(str(out.parent))
    with pytest.raises(ValueError, match="over protobuf's 2 GiB limit") as e:
        nibble_api.quantize(small["model"], calibration_method="rtn_dq", block_size=32, output_path=str(out),
                            use_external_data_format=False, log_level="WARNING")
    assert "nothing was written" in str(e.value)
    assert folder_digest(str(out.parent)) == before


def test_layer_by_layer_keyword_is_a_mode():
    """layer_by_layer=False must say off (a dropped False flag would mean the default, auto)."""
    from nibble._api import _kwarg_flags
    assert _kwarg_flags({"layer_by_layer": False}) == ["--layer_by_layer=off"]
    assert _kwarg_flags({"layer_by_layer": True}) == ["--layer_by_layer=on"]
    assert _kwarg_flags({"layer_by_layer": "auto"}) == ["--layer_by_layer=auto"]

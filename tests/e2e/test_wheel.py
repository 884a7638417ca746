"""The wheel, repaired by auditwheel ($NIBBLE_WHEEL) and installed into a fresh venv by scripts/test_wheel
($NIBBLE_WHEEL_VENV), run from outside the source tree with no NIBBLE_* variable: the wheel has a
manylinux tag, the installed binary loads its libraries from the venv, the `nibble` command (rtn_dq,
awq_lite) writes the same bytes as the build's binary, and `import nibble; nibble.quantize(...)` works
from a data reader. The package's dependencies are checked against calib/requirements.txt here, wheel
or not."""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from . import models
from .conftest import REPO, Nibble, folder_digest

VENV = os.environ.get("NIBBLE_WHEEL_VENV", "")
WHEEL = os.environ.get("NIBBLE_WHEEL", "")
needs_wheel = pytest.mark.skipif(not VENV, reason="needs the installed wheel: run scripts/test_wheel")


def _pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for ln in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)==(\S+)", ln)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_wheel_dependencies_are_the_runtime_requirements():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(REPO, "calib", "requirements.txt")) as f:
        runtime = _pins(f.read().splitlines())
    with open(os.path.join(REPO, "scripts", "requirements.txt")) as f:
        dev = _pins(f.read().splitlines())
    assert _pins(project["dependencies"]) == runtime
    assert all(dev[k] == v for k, v in runtime.items()), "calib/requirements.txt and scripts/requirements.txt differ"
    assert _pins(project["optional-dependencies"]["gpu"]) == {"onnxruntime-gpu": runtime["onnxruntime"]}


@needs_wheel
def test_wheel_is_manylinux_with_no_external_libraries():
    assert WHEEL, "NIBBLE_WHEEL is not set: scripts/test_wheel sets it to the repaired wheel"
    # The timeout only guards against a hang: auditwheel reads every library (minutes on a loaded 2-core machine).
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", WHEEL],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    show = json.loads(r.stdout)
    assert show["overall_tag"].startswith("manylinux_"), show["overall_tag"]
    assert show["external_libs"] == {}, show["external_libs"]


# What the binary links beyond the manylinux policy's system libraries: grafted into nibble.libs/.
GRAFTED = ("libprotobuf", "libonnx", "libopenblas", "libspdlog", "libfmt", "libgfortran", "libgomp", "libquadmath")


def _ldd(path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # the binary's RPATH alone
    r = subprocess.run(["ldd", path], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "not found" not in r.stdout, r.stdout
    return dict(m.groups() for m in re.finditer(r"^\s*(\S+) => (\S+) \(", r.stdout, re.M))


@needs_wheel
def test_installed_binary_loads_the_grafted_libraries_from_the_venv():
    binaries = glob.glob(os.path.join(VENV, "lib", "python*", "site-packages", "nibble", "bin", "nibble"))
    assert len(binaries) == 1, binaries
    resolved = _ldd(binaries[0])
    venv = os.path.realpath(VENV) + os.sep
    for lib in GRAFTED:
        paths = [p for name, p in resolved.items() if name.startswith(lib)]
        assert paths, f"{lib} not linked: {resolved}"
        assert all(os.path.realpath(p).startswith(venv) for p in paths), f"{lib} from outside the venv: {paths}"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIBBLE_")}
    env["PATH"] = "/usr/bin:/bin"  # not the venv's bin: the command must not need an activated venv
    return env


@pytest.fixture(scope="module")
def small(tmp_path_factory, model_cache) -> dict:
    spec, path = model_cache.llama(hidden=64, inter=128, layers=2, vocab=64)
    d = str(tmp_path_factory.mktemp("wheel"))
    npz = os.path.join(d, "calib.npz")
    np.savez(npz, hidden=models.llama_inputs(spec, batch=4, seq=16)["hidden"])
    return {"model": path, "npz": npz}


@needs_wheel
@pytest.mark.parametrize("algo", ["rtn_dq", "awq_lite"])
def test_nibble_command_writes_the_build_binary_model(small, nibble: Nibble, tmp_path, algo):
    calib = ["--calib_data", small["npz"], "--calib_size", "4", "--calibration_eps", "cpu"] if algo == "awq_lite" else []
    args = ["--algo", algo, "--block_size", "32", *calib]
    nibble.quantize(small["model"], str(tmp_path / "built" / "model.onnx"), *args)
    r = subprocess.run([os.path.join(VENV, "bin", "nibble"), "quantize", "--onnx_path", small["model"],
                        "--output_path", "out/model.onnx", *args], cwd=str(tmp_path), env=_clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert folder_digest(str(tmp_path / "out")) == folder_digest(str(tmp_path / "built"))


API_SCRIPT = """
import sys, numpy as np, onnx, nibble
class Reader:  # ONNX Runtime's CalibrationDataReader interface
    def __init__(self, x): self.it = iter([{"hidden": x[i:i + 1]} for i in range(len(x))])
    def get_next(self): return next(self.it, None)
assert nibble.__file__.startswith(sys.prefix), nibble.__file__
x = np.load(sys.argv[2])["hidden"]
m = nibble.quantize(sys.argv[1], calibration_method="awq_lite", calibration_data_reader=Reader(x),
                    calibration_eps=["cpu"], block_size=32, output_path="api/model.onnx")
print(sum(n.op_type == "DequantizeLinear" for n in m.graph.node))
try:
    nibble.quantize("missing.onnx", calibration_method="rtn_dq", log_level="ERROR")
except nibble.NibbleError as e:
    print("error:", e)
"""


@needs_wheel
def test_python_api_from_the_wheel(small, nibble: Nibble, tmp_path):
    nibble.quantize(small["model"], str(tmp_path / "built" / "model.onnx"), "--algo", "awq_lite", "--block_size", "32",
                    "--calib_data", small["npz"], "--calib_size", "4", "--calibration_eps", "cpu")
    r = subprocess.run([os.path.join(VENV, "bin", "python"), "-c", API_SCRIPT, small["model"], small["npz"]],
                       cwd=str(tmp_path), env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    dq, err = r.stdout.strip().splitlines()
    assert int(dq) > 0
    assert err.startswith("error: ") and "missing.onnx" in err and "nibble:" not in err, err
    assert folder_digest(str(tmp_path / "api")) == folder_digest(str(tmp_path / "built"))

"""`cmake --install` into a temporary prefix, then the installed binary run from outside the source
tree: it finds its scripts in <prefix>/share/nibble (relative to itself, so the prefix can move) and
never in the source tree, its Python as documented ($NIBBLE_PYTHON, a python3 beside it, python3
on PATH), and a Python without the requirements gives one error line naming what is missing and how
to install it. The build folder is the one of $NIBBLE_BIN."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from . import models
from .conftest import NIBBLE_BIN, REPO, Nibble, folder_digest

BUILD = os.path.dirname(os.path.abspath(NIBBLE_BIN))
VENV_PY = os.path.join(REPO, ".venv", "bin", "python")
# Every module of calib/: capture.py imports them all from its own folder.
CALIB_MODULES = sorted(f"calib/{f}" for f in os.listdir(os.path.join(REPO, "calib")) if f.endswith(".py"))
SCRIPTS = [*CALIB_MODULES, "calib/requirements.txt", "tools/eval_model.py", "tools/eval_ppl.py", "tools/corpus.py",
           "configs/modelopt-default.toml"]


def installed_env(**extra: str) -> dict[str, str]:
    """The environment without any NIBBLE_* override, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIBBLE_")}
    env.update(extra)
    return env


def run(binary: str, *args: str, cwd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    assert os.path.isfile(os.path.join(BUILD, "CMakeCache.txt")), f"{BUILD} is not a CMake build folder"
    root = str(tmp_path_factory.mktemp("install"))
    first = os.path.join(root, "first")
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", first], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # Moved after installing: only paths relative to the binary can work.
    moved = os.path.join(root, "moved")
    shutil.move(first, moved)
    return moved


@pytest.fixture(scope="module")
def small(tmp_path_factory, model_cache) -> dict[str, str]:
    spec, path = model_cache.llama(hidden=64, inter=128, layers=2, vocab=64)
    d = str(tmp_path_factory.mktemp("calib"))
    npz = os.path.join(d, "calib.npz")
    np.savez(npz, hidden=models.llama_inputs(spec, batch=4, seq=16)["hidden"])  # 4 samples of [16, H]
    return {"model": path, "npz": npz, "work": d}


def test_install_layout(prefix):
    assert os.access(os.path.join(prefix, "bin", "nibble"), os.X_OK)
    for s in SCRIPTS:
        assert os.path.isfile(os.path.join(prefix, "share", "nibble", s)), s


@pytest.mark.parametrize("algo", ["rtn_dq", "awq_lite"])
def test_installed_binary_writes_the_build_binary_model(prefix, small, nibble: Nibble, tmp_path, algo):
    """Run from a folder outside the source tree with NIBBLE_PYTHON = the project venv's python: the
    same bytes as the build folder's binary."""
    calib = ["--calib_data", small["npz"], "--calib_size", "4"] if algo == "awq_lite" else []
    args = ["--algo", algo, "--block_size", "32", *calib]
    built = nibble.quantize(small["model"], str(tmp_path / "built" / "model.onnx"), *args)
    assert built.returncode == 0
    r = run(os.path.join(prefix, "bin", "nibble"), "quantize", "--onnx_path", small["model"],
            "--output_path", "out/model.onnx", *args, cwd=str(tmp_path), env=installed_env(NIBBLE_PYTHON=VENV_PY))
    assert r.returncode == 0, r.stderr
    assert folder_digest(str(tmp_path / "out")) == folder_digest(str(tmp_path / "built"))


def test_installed_binary_never_falls_back_to_the_source_tree(prefix, small, tmp_path):
    """Without its installed capture.py, the installed binary says where it looked (the prefix), even
    though the source tree it was built from still has calib/capture.py."""
    copy = str(tmp_path / "prefix")
    shutil.copytree(prefix, copy)
    os.remove(os.path.join(copy, "share", "nibble", "calib", "capture.py"))
    r = run(os.path.join(copy, "bin", "nibble"), "quantize", "--onnx_path", small["model"], "--output_path",
            "out/model.onnx", "--calib_data", small["npz"], cwd=str(tmp_path), env=installed_env(NIBBLE_PYTHON=VENV_PY))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    expected = os.path.join(copy, "share", "nibble", "calib", "capture.py")
    assert lines[-1].startswith("nibble: error: cannot find " + expected), r.stderr
    assert not os.path.exists(tmp_path / "out" / "model.onnx")


def _python_wrapper(folder: str) -> str:
    """A `python3` that is the project venv's (a script, since a symlink out of a venv loses it)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "python3")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{VENV_PY}" "$@"\n')
    os.chmod(path, 0o755)
    return path


@pytest.mark.parametrize("where", ["path", "beside"])
def test_python_found_without_nibble_python(prefix, small, tmp_path, where):
    """No NIBBLE_PYTHON: a python3 beside the binary (an install into a venv), else python3 on PATH."""
    copy = str(tmp_path / "prefix")
    shutil.copytree(prefix, copy)
    env = installed_env()
    if where == "path":
        env["PATH"] = _python_wrapper(str(tmp_path / "pybin")).rsplit("/", 1)[0] + os.pathsep + env.get("PATH", "")
    else:
        _python_wrapper(os.path.join(copy, "bin"))
        env["PATH"] = "/usr/bin:/bin"
    r = run(os.path.join(copy, "bin", "nibble"), "quantize", "--onnx_path", small["model"], "--output_path",
            "out/model.onnx", "--algo", "awq_lite", "--block_size", "32", "--calib_data", small["npz"],
            cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(tmp_path / "out" / "model.onnx")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with none of the requirements: a venv made without pip."""
    d = str(tmp_path_factory.mktemp("bare"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", d], check=True)
    return os.path.join(d, "bin", "python")


def test_missing_requirements_one_line(prefix, small, bare_python, tmp_path):
    req = os.path.join(prefix, "share", "nibble", "calib", "requirements.txt")
    r = run(os.path.join(prefix, "bin", "nibble"), "quantize", "--onnx_path", small["model"], "--output_path",
            "out/model.onnx", "--calib_data", small["npz"], cwd=str(tmp_path),
            env=installed_env(NIBBLE_PYTHON=bare_python))
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"nibble: error: calibration: the Python {bare_python} lacks the package(s) "
                                f"numpy, onnx, onnxruntime: run `{bare_python} -m pip install -r {req}`"), r.stderr
    assert "Traceback" not in r.stderr


def test_missing_requirements_eval_one_line(prefix, small, bare_python, tmp_path):
    r = run(os.path.join(prefix, "bin", "nibble"), "eval", "--model", small["model"], cwd=str(tmp_path),
            env=installed_env(NIBBLE_PYTHON=bare_python))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"nibble: error: eval: the Python {bare_python} lacks the package(s) numpy, onnxruntime, tokenizers"), r.stderr


def test_no_python_at_all(prefix, small, tmp_path):
    r = run(os.path.join(prefix, "bin", "nibble"), "quantize", "--onnx_path", small["model"], "--output_path",
            "out/model.onnx", "--calib_data", small["npz"], cwd=str(tmp_path),
            env=installed_env(NIBBLE_PYTHON=str(tmp_path / "no-such-python")))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == (
        f"nibble: error: cannot run {tmp_path / 'no-such-python'}: No such file or directory "
        "(set NIBBLE_PYTHON to a Python with nibble's requirements)"), r.stderr

"""The CUDA wheel, installed with its `cuda13` (or, with --cu12, `cuda12`) extra into a fresh venv by
scripts/test_wheel_cuda ($NIBBLE_WHEEL_CUDA_VENV, $NIBBLE_WHEEL_CUDA_VARIANT): the binary resolves cudart,
cuBLAS and cuSOLVER from NVIDIA's runtime wheels in that venv (not from the system toolkit, which this
machine also has), the emulated device passes every operation from the installed wheel, and `--device
auto` on a machine without a GPU says why it uses the CPU and writes the CPU's bytes."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from .conftest import Nibble, folder_digest
from .test_wheel import GRAFTED, _clean_env, _ldd

VENV = os.environ.get("NIBBLE_WHEEL_CUDA_VENV", "")
pytestmark = pytest.mark.skipif(not VENV, reason="needs the installed CUDA wheel: run scripts/test_wheel_cuda")

VARIANT = os.environ.get("NIBBLE_WHEEL_CUDA_VARIANT", "cu13")
# What the binary loads from CUDA, and the wheel folder (under site-packages) each must come from. CUDA
# 12's wheels keep a folder per library; cuSPARSE and nvJitLink are cuSOLVER's, found by its RUNPATH.
CUDA_LIB_FOLDERS = {
    "cu13": {lib: "nvidia/cu13/lib" for lib in
             ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcusolver.so.12"]},
    "cu12": {"libcudart.so.12": "nvidia/cuda_runtime/lib", "libcublas.so.12": "nvidia/cublas/lib",
             "libcublasLt.so.12": "nvidia/cublas/lib", "libcusolver.so.11": "nvidia/cusolver/lib",
             "libcusparse.so.12": "nvidia/cusparse/lib", "libnvJitLink.so.12": "nvidia/nvjitlink/lib"},
}[VARIANT]
# What auditwheel may find outside the wheel: CUDA's libraries only.
CUDA_EXTERNAL = {"cu13": {"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcusolver.so.12",
                          "libcusparse.so.12", "libnvJitLink.so.13"},
                 "cu12": set(CUDA_LIB_FOLDERS)}[VARIANT]


def _site_packages() -> str:
    found = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages"))
    assert len(found) == 1, found
    return found[0]


def _installed(*args: str, timeout: int = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(VENV, "bin", "nibble"), *args], env=_clean_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_binary_resolves_cuda_from_the_runtime_wheels_and_the_rest_from_the_wheel():
    binary = os.path.join(_site_packages(), "nibble", "bin", "nibble")
    libs = _ldd(binary)
    for name, folder in CUDA_LIB_FOLDERS.items():
        assert name in libs, f"{binary} does not load {name}: {sorted(libs)}"
        wheel_lib = os.path.realpath(os.path.join(_site_packages(), folder))
        assert os.path.dirname(os.path.realpath(libs[name])) == wheel_lib, f"{name} => {libs[name]}"
    venv = os.path.realpath(VENV) + os.sep
    for lib in GRAFTED:  # the C++ libraries auditwheel grafted, as in the CPU wheel
        paths = [p for name, p in libs.items() if name.startswith(lib)]
        assert paths and all(os.path.realpath(p).startswith(venv) for p in paths), f"{lib}: {paths}"


def test_selftest_on_the_emulated_device_from_the_wheel():
    r = _installed("selftest", "--device", "cuda_emulated", timeout=600)
    assert r.returncode == 0, r.stderr
    passed = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("PASS")]
    assert len(passed) >= 23 and not any(ln.startswith("FAIL") for ln in r.stdout.splitlines()), r.stdout
    assert "cuda_emulated: %d operations, 0 failed" % len(passed) in r.stdout, r.stdout


def test_device_auto_without_a_gpu_says_why_and_writes_the_cpu_model(model_cache, nibble: Nibble, tmp_path):
    _, path = model_cache.llama(hidden=64, inter=128, layers=2, vocab=64)
    r = _installed("quantize", "--onnx_path", path, "--output_path", "auto/model.onnx", "--algo", "rtn_dq",
                   "--block_size", "32", "--device", "auto", cwd=str(tmp_path))
    if r.returncode == 0 and "no usable CUDA device" not in r.stderr:
        pytest.skip("this machine has a usable GPU: --device auto picked it")
    assert r.returncode == 0, r.stderr
    why = [ln for ln in r.stderr.splitlines() if "device auto: no usable CUDA device (" in ln]
    assert len(why) == 1 and "); using CPU" in why[0], r.stderr
    nibble.quantize(path, str(tmp_path / "cpu" / "model.onnx"), "--algo", "rtn_dq", "--block_size", "32",
                    "--device", "cpu")
    assert folder_digest(str(tmp_path / "auto")) == folder_digest(str(tmp_path / "cpu"))


def test_python_imports_the_package_from_the_venv():
    r = subprocess.run([os.path.join(VENV, "bin", "python"), "-c", "import nibble, sys; print(nibble.__file__)"],
                       env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout.strip()).startswith(os.path.realpath(_site_packages())), r.stdout


def test_wheel_is_manylinux_needing_only_cuda_from_outside():
    wheel = os.environ.get("NIBBLE_WHEEL", "")
    assert wheel, "NIBBLE_WHEEL is not set: scripts/test_wheel_cuda sets it to the repaired wheel"
    # repair wrote the tag with CUDA's libraries excluded; `show` knows no exclusions, so its overall
    # tag is not checked here, only that CUDA's libraries are all it finds outside the wheel.
    assert "-manylinux_2_35_x86_64" in os.path.basename(wheel), wheel
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", wheel],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    external = set(json.loads(r.stdout)["external_libs"])
    assert external, "auditwheel show finds no external library: CUDA's should be"
    assert external <= CUDA_EXTERNAL, external

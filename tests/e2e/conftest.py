"""Shared fixtures and helpers of the nibble end-to-end suite.

Run:  .venv/bin/python -m pytest tests/e2e -q
The binary is $NIBBLE_BIN (default <repo>/build/nibble).  A missing binary FAILS the tests that
need it (with a message saying so); the reference self-checks run without it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from . import models

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NIBBLE_BIN = os.environ.get("NIBBLE_BIN", os.path.join(REPO, "build", "nibble"))
# A hang guard, not a speed limit: the SmolLM2 runs on the emulated device take ~100 s on a loaded 2-core
# machine (CI machines differ 1.6x in clock), so 120 s failed runs that were only slow.
RUN_TIMEOUT_S = 600


# --------------------------------------------------------------------------------------------
# Running the binary
# --------------------------------------------------------------------------------------------

def folder_digest(folder: str) -> dict[str, str]:
    """{relative path: sha256} of every file below folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def listing(folder: str) -> list[str]:
    """Sorted relative paths of everything (files, dirs, hidden) below folder."""
    out = []
    for root, dirs, files in os.walk(folder):
        out += [os.path.relpath(os.path.join(root, d), folder) + "/" for d in dirs]
        out += [os.path.relpath(os.path.join(root, f), folder) for f in files]
    return sorted(out)


def data_file(model_path: str) -> str:
    """Path of the one external data file the graph at model_path references (nibble names it
    OUT.<hash of its content>.data); "" if every tensor is inline."""
    m = onnx.load(model_path, load_external_data=False)
    locs = {e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"}
    assert len(locs) <= 1, f"{model_path} references several data files: {sorted(locs)}"
    return os.path.join(os.path.dirname(os.path.abspath(model_path)), locs.pop()) if locs else ""


def is_data_file_of(out_name: str, name: str) -> bool:
    """name is OUT.<16 hex>.data of the output named out_name."""
    mid = name[len(out_name) + 1:-len(".data")]
    return (name.startswith(out_name + ".") and name.endswith(".data") and len(mid) == 16
            and all(c in "0123456789abcdef" for c in mid))


@dataclasses.dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"$ {' '.join(shlex.quote(a) for a in self.args)}\n-> exit {self.returncode}\n"
                f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}")


class Nibble:
    def __init__(self, binary: str):
        self.binary = binary

    def run(self, *args: str, timeout: int = RUN_TIMEOUT_S, cwd: str | None = None) -> Result:
        cmd = [self.binary, *map(str, args)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return Result(cmd, p.returncode, p.stdout, p.stderr)

    def quantize(self, onnx_path: str, output_path: str, *args: str, check: bool = True,
                 watch: list[str] | None = None, cwd: str | None = None) -> Result:
        """nibble quantize --onnx_path IN --output_path OUT ARGS.  Asserts that the input model's
        folder (and every folder in `watch`) is byte-identical afterwards, and, with check, exit 0."""
        folders = [os.path.dirname(os.path.abspath(os.path.join(cwd or "", onnx_path)))] + list(watch or [])
        before = {f: folder_digest(f) for f in folders}
        r = self.run("quantize", "--onnx_path", onnx_path, "--output_path", output_path, *args, cwd=cwd)
        for f in folders:
            after = folder_digest(f)
            assert after == before[f], (f"input folder {f} changed by the run:\n"
                                        f"before {before[f]}\nafter {after}\n{r.describe()}")
        if check:
            assert r.returncode == 0, f"nibble failed:\n{r.describe()}"
        return r


def smollm2_dir(conv, dtype: str = "fp32") -> str:
    """SmolLM2-135M as `dtype` (fp32 or fp16) ONNX (tools/smollm2_to_onnx.py, module `conv`), built once into
    build/e2e-cache/smollm2-<dtype>-<hash of the converter and the GGUF>/ and shared by the test files that
    use it. A lock file serialises the build: pytest-xdist workers may ask for it at the same time."""
    import fcntl
    import glob
    import shutil
    cache = os.path.join(REPO, "build", "e2e-cache")
    os.makedirs(cache, exist_ok=True)
    d = os.path.join(cache, f"smollm2-{dtype}-{conv.source_fingerprint()}")
    stamp = os.path.join(d, ".complete")
    with open(os.path.join(cache, f"smollm2-{dtype}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(stamp):
            for old in glob.glob(os.path.join(cache, f"smollm2-{dtype}-*")):
                shutil.rmtree(old, ignore_errors=True)     # stale builds of older converters, or a torn one
            conv.convert(d, dtype, log=lambda m: None)
            open(stamp, "w").close()
    return d


def smollm2_fp32_dir(conv) -> str:
    return smollm2_dir(conv, "fp32")


def pytest_configure(config):
    # `slow`: a test that repeats, at length, code that faster tests already run (timed kills, the
    # same run at several thread counts). The sanitizer pass (scripts/test_sanitize) leaves them out;
    # the plain pass runs them all.
    config.addinivalue_line("markers", "slow: long repeats of code other tests run; not in the sanitizer pass")


@pytest.fixture(scope="session")
def nibble() -> Nibble:
    assert os.path.isfile(NIBBLE_BIN) and os.access(NIBBLE_BIN, os.X_OK), (
        f"nibble binary not found or not executable at {NIBBLE_BIN!r}: build it first "
        f"(cmake -B build && cmake --build build) or point NIBBLE_BIN at it")
    return Nibble(NIBBLE_BIN)


# --------------------------------------------------------------------------------------------
# Model cache (one build per session)
# --------------------------------------------------------------------------------------------

class ModelCache:
    def __init__(self, root: str):
        self.root = root

    def llama(self, **kw) -> tuple[models.LlamaSpec, str]:
        spec = models.LlamaSpec(**kw)
        return spec, models.build_cached(self.root, spec.tag, lambda: models.make_llama(spec), spec.storage)

    def gemm(self, **kw) -> tuple[models.GemmSpec, str]:
        spec = models.GemmSpec(**kw)
        return spec, models.build_cached(self.root, spec.tag, lambda: models.make_gemm(spec), spec.storage)

    def selection(self, opset: int = 21) -> str:
        return models.build_cached(self.root, f"selection_op{opset}", lambda: models.make_selection(opset))


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> ModelCache:
    return ModelCache(str(tmp_path_factory.mktemp("models")))


# --------------------------------------------------------------------------------------------
# Reading the output model without onnx's external-data loader (we check the layout ourselves)
# --------------------------------------------------------------------------------------------

NP_OF = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
         TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8, TensorProto.INT32: np.int32,
         TensorProto.INT64: np.int64}


class Graph:
    """An ONNX file read with load_external_data=False; tensors resolved by hand."""

    def __init__(self, path: str):
        self.path = path
        self.folder = os.path.dirname(os.path.abspath(path))
        self.model = onnx.load(path, load_external_data=False)
        g = self.model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.nodes = {n.name: n for n in g.node}
        assert len(self.nodes) == len(g.node), "duplicate node names in " + path
        self.node_list = list(g.node)

    def opset(self, domain: str = "") -> int | None:
        for o in self.model.opset_import:
            if o.domain == domain or (domain == "" and o.domain == "ai.onnx"):
                return o.version
        return None

    def consumers(self, tensor: str) -> list[onnx.NodeProto]:
        return [n for n in self.node_list if tensor in n.input]

    def producers(self, tensor: str) -> list[onnx.NodeProto]:
        return [n for n in self.node_list if tensor in n.output]

    def external_files(self) -> set[str]:
        locs = set()
        for t in self.inits.values():
            if t.data_location == TensorProto.EXTERNAL:
                locs.add(dict((e.key, e.value) for e in t.external_data)["location"])
        return locs

    def raw(self, name: str) -> bytes:
        """The tensor's bytes as stored (raw_data or external); error for typed-field tensors."""
        t = self.inits[name]
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            loc = info["location"]
            assert not os.path.isabs(loc) and ".." not in loc.split("/"), f"{name}: bad location {loc!r}"
            off = int(info.get("offset", 0))
            p = os.path.join(self.folder, loc)
            size = os.path.getsize(p)
            length = int(info["length"]) if "length" in info else size - off
            assert off + length <= size, f"{name}: offset {off} + length {length} > size {size} of {loc}"
            with open(p, "rb") as f:
                f.seek(off)
                return f.read(length)
        assert t.HasField("raw_data"), f"{name}: no raw_data (typed fields)"
        return t.raw_data

    def array(self, name: str) -> np.ndarray:
        """Numeric (non-4-bit) initializer as numpy, from raw/external bytes or typed fields."""
        t = self.inits[name]
        dt = NP_OF[t.data_type]
        shape = tuple(t.dims)
        if t.data_location == TensorProto.EXTERNAL or t.HasField("raw_data"):
            b = self.raw(name)
            a = np.frombuffer(b, dt)
            assert a.size == int(np.prod(shape)), f"{name}: {a.size} elements stored, shape {shape}"
            return a.reshape(shape).copy()
        if t.data_type == TensorProto.FLOAT16:
            return np.array(t.int32_data, np.int32).astype(np.uint16).view(np.float16).reshape(shape)
        return onnx.numpy_helper.to_array(t)

    def int4(self, name: str) -> tuple[np.ndarray, int]:
        """(codes, data_type) of an INT4/UINT4 initializer (int8 sign-extended / uint8)."""
        from .reference import unpack_int4
        t = self.inits[name]
        assert t.data_type in (TensorProto.INT4, TensorProto.UINT4), \
            f"{name}: data_type {TensorProto.DataType.Name(t.data_type)}, INT4/UINT4 expected"
        shape = tuple(t.dims)
        if t.data_location == TensorProto.EXTERNAL or t.HasField("raw_data"):
            raw = self.raw(name)
        else:  # int32_data holds the packed bytes per the ONNX spec
            raw = np.array(t.int32_data, np.int32).astype(np.uint8).tobytes()
        return unpack_int4(raw, shape, t.data_type == TensorProto.INT4), t.data_type


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


# --------------------------------------------------------------------------------------------
# ONNX Runtime
# --------------------------------------------------------------------------------------------

_PROBE: dict[str, bool] = {}


def ort_fp16_per_axis_quantize_truncates() -> bool:
    """Does this ORT's CPU QuantizeLinear truncate fp16 inputs on the per-axis path?  (1.24.4 does:
    onnxruntime #18576/#22741, fixed by PR #32452.)  Probed once with the PR's reproduction."""
    if "trunc" not in _PROBE:
        import onnxruntime as ort
        from onnx import helper, numpy_helper
        x = np.array([[0.050018310546875, -0.050018310546875]], np.float16)
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1)
        g = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 2])],
                              [helper.make_tensor_value_info("q", TensorProto.INT8, [1, 2])],
                              [numpy_helper.from_array(np.full(2, 0.0999755859375, np.float16), "s"),
                               numpy_helper.from_array(np.zeros(2, np.int8), "z")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        q = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        _PROBE["trunc"] = q.ravel().tolist() == [0, 0]
    return _PROBE["trunc"]


def ort_run(path: str, feeds: dict[str, np.ndarray], optimize: bool = True) -> dict[str, np.ndarray]:
    """Run on CPUExecutionProvider, 1 thread.  optimize=True keeps ORT's default level (ALL), where
    DequantizeLinear->MatMul is fused into MatMulNBits; accuracy level pinned to 1 (fp32 A), see
    docs/usage.md "Output formats".  optimize=False runs the graph as written (ONNX semantics)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))

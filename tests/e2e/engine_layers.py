"""The layer engine against ONNX Runtime layer by layer, two ways (used by test_forward.py and
bench/engine_per_layer.py):

  chained   one `nibble forward` of the whole graph: layer L reads the engine's own layers 0..L-1 (what the
            calibration runs), so a difference in an early layer is carried to the later ones;
  per layer each decoder layer cut out as its own graph (calib/layers.py's LayerCut, the cut the
            layer-by-layer pass uses) and run by `nibble forward` on ONNX Runtime's values of what enters
            it: what the engine adds in that layer alone;

and ONNX Runtime against itself: its session with only the basic graph optimizations (no fusions), chained,
against the default one: how far two correct runs of the graph drift apart (in fp16 as far as the engine
chained: each rounding to fp16 that lands on the other side of a step is carried on). In fp16 ONNX
Runtime's CPU provider keeps some values in float32 between the Casts it inserts; a cut layer's inputs are
the graph's fp16 values, so the per-layer figure includes that rounding of its inputs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx

from .conftest import REPO
from .test_forward import FEED_DTYPE, matmul_activations, rel_rms

NP_OF = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


def native(nibble: str, model: str, feeds: dict, names: list[str], work: str) -> dict:
    """`nibble forward` of `model` on `feeds`: the named values."""
    fd, out = os.path.join(work, "feeds"), os.path.join(work, "out")
    os.makedirs(fd, exist_ok=True)
    index = []
    for i, (name, arr) in enumerate(feeds.items()):
        arr = np.ascontiguousarray(arr)
        arr.tofile(os.path.join(fd, f"f{i}.bin"))
        index.append({"name": name, "dtype": FEED_DTYPE[arr.dtype], "shape": list(arr.shape), "file": f"f{i}.bin"})
    with open(os.path.join(fd, "index.json"), "w") as f:
        json.dump(index, f)
    r = subprocess.run([nibble, "forward", "--onnx_path", model, "--feeds", fd, "--values", ",".join(names),
                        "--out", out], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nibble forward {model}: {r.stderr.strip()}")
    with open(os.path.join(out, "index.json")) as f:
        top = json.load(f)
    return {e["name"]: np.fromfile(os.path.join(out, e["file"]), dtype=NP_OF[e["dtype"]]).reshape(e["shape"])
            for e in top["values"]}


def ort_values(model_path: str, feeds: dict, names: list[str], basic: bool = False) -> dict:
    """The named values from one ONNX Runtime session of the whole graph (CPU, default optimizations, or only
    the basic ones), each added as an output with no type (ONNX Runtime gives it the type it computes)."""
    import onnxruntime as ort
    m = onnx.load(model_path, load_external_data=False)
    outs = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in outs)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if basic:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                os.path.dirname(os.path.abspath(model_path)))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, feeds)))


def layer_groups(acts: list[str]) -> list[list[str]]:
    """The activations of each decoder layer (`/model/layers.L/...`), in order."""
    by_layer: dict[int, list[str]] = {}
    for a in acts:
        m = re.search(r"/layers\.(\d+)/", a)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append(a)
    return [by_layer[k] for k in sorted(by_layer)]


def _onnx_type(arr: np.ndarray) -> int:
    return {np.dtype(np.float16): onnx.TensorProto.FLOAT16, np.dtype(np.float32): onnx.TensorProto.FLOAT,
            np.dtype(np.int32): onnx.TensorProto.INT32, np.dtype(np.int64): onnx.TensorProto.INT64}[arr.dtype]


def per_layer_errors(nibble: str, model_dir: str, feeds: dict) -> list[tuple[float, float, float]]:
    """(chained, per layer, ONNX Runtime basic) worst relative RMS of each layer's MatMul inputs."""
    sys.path.insert(0, os.path.join(REPO, "calib"))
    from layers import LayerCut
    path = os.path.join(model_dir, "model.onnx")
    m = onnx.load(path, load_external_data=False)
    groups = layer_groups(matmul_activations(m))
    cut = LayerCut(m, groups)
    entering = sorted({t for s in range(len(groups)) for t in cut.needs[s]} - set(feeds))
    acts = [x for g in groups for x in g]
    ref = ort_values(path, feeds, acts + entering)
    basic = ort_values(path, feeds, acts, basic=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine_layers.") as work:
        chained = native(nibble, path, feeds, acts, os.path.join(work, "whole"))
        for f in os.listdir(model_dir):  # the cut layers read the model's external data by its name: a hard
            if f.endswith(".data"):      # link (nibble refuses a symbolic link out of the model folder)
                os.link(os.path.join(model_dir, f), os.path.join(work, f))
        for s, group in enumerate(groups):
            values = {**feeds, **ref}
            in_types = {t: (_onnx_type(values[t]), values[t].ndim) for t in cut.needs[s] if t in values}
            seg = os.path.join(work, f"layer{s}.onnx")
            with open(seg, "wb") as f:
                f.write(cut.model_bytes(m, s, in_types, group))
            alone = native(nibble, seg, {t: values[t] for t in cut.last_inputs}, group, os.path.join(work, f"l{s}"))
            rows.append(tuple(max(rel_rms(v[x], ref[x]) for x in group) for v in (chained, alone, basic)))
    return rows

"""`nibble.quantize`: ModelOpt 0.47's `modelopt.onnx.quantization.int4.quantize`, signature and defaults,
run by the `nibble quantize` command line in a child process (one implementation: the CLI's).

Calibration data (an ONNX Runtime CalibrationDataReader, or any iterable of feed dicts) is written to a
temporary .npz, axis 0 = samples, and passed as --calib_data. Without one, calibrated methods use
random token ids (--use_random_calib), as ModelOpt's RandomDataProvider does.

The returned onnx.ModelProto: with output_path= the model is written there (graph + one external data
file beside it) and the returned proto is that graph with its weights left on disk (external data
references relative to output_path's folder; onnx.external_data_helper.load_external_data_for_model
reads them in when you need them), so a model of any size costs only its graph in memory. Without
output_path the model is written to a temporary folder and returned with every weight loaded into
memory, as ModelOpt returns it; the folder is removed.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Iterable, Sequence

from ._cli import binary, child_env

_log = logging.getLogger("nibble")
# One .onnx file is one protobuf message: 2 GiB at most.
PROTO_LIMIT = 2 ** 31


@functools.lru_cache(maxsize=None)
def _methods(exe: str) -> tuple[dict, ...]:
    """The method registry of the binary at exe (`nibble methods --json`), read once per binary."""
    p = subprocess.run([exe, "methods", "--json"], capture_output=True, text=True, env=child_env())
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines()
        msg = lines[-1].removeprefix("nibble: error: ") if lines else f"exit {p.returncode}"
        raise NibbleError(msg, p.returncode, p.stderr)
    return tuple(json.loads(p.stdout)["methods"])


def calibrated_methods() -> list[str]:
    """The methods that calibrate (a scale or clip search, or GPTQ's Hessian), as the binary lists them."""
    return [m["name"] for m in _methods(binary()) if m["calibrates"]]


def calibrates(calibration_method: str, kwargs: dict) -> bool:
    # Mixed precision by sensitivity calibrates whatever the method.
    return calibration_method in calibrated_methods() or kwargs.get("mixed_strategy") == "sensitivity"


class NibbleError(RuntimeError):
    """nibble failed: str(e) is its one-line error message; returncode and stderr as it exited."""

    def __init__(self, message: str, returncode: int, stderr: str):
        super().__init__(message)
        self.returncode, self.stderr = returncode, stderr


def _feeds(reader: Any) -> list[dict]:
    """The feed dicts of a CalibrationDataReader (get_next() until None) or of an iterable."""
    if hasattr(reader, "get_next"):
        out = []
        while (feed := reader.get_next()) is not None:
            out.append(feed)
        return out
    if isinstance(reader, dict):
        return [reader]
    return list(reader)


def write_calibration_npz(reader: Any, path: str) -> int:
    """The reader's feeds concatenated along axis 0 (the batch axis of each feed) into path.npz;
    returns the number of samples. Every feed must name the same inputs with the same shapes past
    axis 0, as nibble's --calib_data reads one array per input."""
    import numpy as np
    feeds = _feeds(reader)
    if not feeds:
        raise ValueError("calibration_data_reader gave no feeds")
    names = list(feeds[0])
    arrays: dict[str, list] = {n: [] for n in names}
    for i, feed in enumerate(feeds):
        if not isinstance(feed, dict) or sorted(feed) != sorted(names):
            raise ValueError(f"calibration feed {i}: a dict of the inputs {names} expected")
        for n in names:
            a = np.asarray(feed[n])
            if a.ndim == 0:
                raise ValueError(f"calibration feed {i}: input '{n}' is a scalar; axis 0 must be the batch")
            if arrays[n] and a.shape[1:] != arrays[n][0].shape[1:]:
                raise ValueError(f"calibration feed {i}: input '{n}' has shape {list(a.shape)}, feed 0's has "
                                 f"{list(arrays[n][0].shape)}: nibble needs the same shape past axis 0 in every "
                                 f"feed (pad the sequences to one length)")
            arrays[n].append(a)
    stacked = {n: np.concatenate(v, axis=0) for n, v in arrays.items()}
    np.savez(path, **stacked)
    return int(next(iter(stacked.values())).shape[0])


def _kwarg_flags(kwargs: dict[str, Any]) -> list[str]:
    """ModelOpt's **kwargs (and any `nibble quantize` flag by name) as command-line flags."""
    flags = []
    for k, v in kwargs.items():
        if k == "awqlite_fuse_nodes":  # ModelOpt's positive spelling of --awqlite_disable_fuse_nodes
            flags += [] if v else ["--awqlite_disable_fuse_nodes"]
        elif k == "layer_by_layer" and isinstance(v, bool):  # not a plain flag: False means off, not the default
            flags.append("--layer_by_layer=" + ("on" if v else "off"))
        elif k == "layers_8bit" and not isinstance(v, str):
            flags.append("--layers_8bit=" + ",".join(v))
        elif v is True:
            flags.append("--" + k)
        elif v is None or v is False:
            continue
        elif isinstance(v, (list, tuple)):
            flags += [f"--{k}={x}" for x in v]
        else:
            flags.append(f"--{k}={v}")
    return flags


def _run(argv: list[str], log_level: str) -> None:
    """Runs nibble, its stderr passed through line by line (unless quiet); a failure raises
    NibbleError with nibble's one-line error message."""
    quiet = log_level.upper() in ("WARNING", "WARN", "ERROR", "CRITICAL")
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
    lines = []
    assert p.stderr is not None
    for line in p.stderr:
        lines.append(line)
        if not quiet or "error" in line:
            sys.stderr.write(line)
    rc = p.wait()
    if rc != 0:
        errors = [ln.strip() for ln in lines if ln.startswith("nibble: error: ")]
        msg = errors[-1][len("nibble: error: "):] if errors else (lines[-1].strip() if lines else f"exit {rc}")
        raise NibbleError(msg, rc, "".join(lines))


# ModelOpt's default calibration_eps. Passed on, any list makes `--calibration_engine auto` choose ONNX
# Runtime (the flag names its execution providers); the default is not passed, so the layer engine runs
# where it can (and ONNX Runtime with the CLI's default providers, cuda then cpu, where it cannot).
_MODELOPT_EPS = ["cpu", "cuda:0", "trt"]


def _cli_args(onnx_path: str, out: str, calibration_method: str, npz: str | None, n_samples: int,
              calibration_eps: Sequence[str], use_zero_point: bool, block_size: int | None,
              nodes_to_exclude: Sequence[str] | None, log_level: str, kwargs: dict) -> list[str]:
    argv = [binary(), "quantize", "--onnx_path", onnx_path, "--output_path", out, "--algo", calibration_method, "--force"]
    if list(calibration_eps) != _MODELOPT_EPS:
        argv.append("--calibration_eps=" + ",".join(calibration_eps))
    if npz:
        argv += ["--calib_data", npz, "--calib_size", str(n_samples)]
    elif calibrates(calibration_method, kwargs) and not kwargs.get("dataset") and not kwargs.get("calib_data"):
        argv.append("--use_random_calib")
    if use_zero_point:
        argv.append("--use_zero_point")
    if block_size is not None:
        argv.append(f"--block_size={block_size}")
    argv += [f"--nodes_to_exclude={p}" for p in (nodes_to_exclude or [""])]
    level = log_level.upper()
    argv += ["--verbose"] if level == "DEBUG" else ["--quiet"] if level in ("WARNING", "WARN", "ERROR", "CRITICAL") else []
    return argv + _kwarg_flags(kwargs)


def quantize(onnx_path: "str | Any", calibration_method: str = "awq_lite", calibration_data_reader: Any = None,
             calibration_eps: list[str] = ["cpu", "cuda:0", "trt"], use_external_data_format: bool = True,
             use_zero_point: bool = False, block_size: int | None = None,
             nodes_to_exclude: list[str] | None = [r"/lm_head"], log_level: str = "INFO",
             input_shapes_profile: Sequence[dict[str, str]] | None = None, output_path: str | None = None,
             **kwargs: Any):
    """INT4 weight-only quantization of an ONNX model; returns the quantized onnx.ModelProto.

    The arguments are ModelOpt 0.47's (`onnx_path` a path or a ModelProto; `calibration_method`
    rtn, rtn_dq, awq_lite, awq_clip or awq_full, and nibble's gptq, awq_gptq, awq_learned, awq_learned_layer, rtn_lsq, rtn_search and hqq; `block_size` None =
    128; `nodes_to_exclude` regexes matched at the start of node names), plus `output_path` (write the
    model there; its weights then stay on disk, see the module's documentation). The arithmetic is
    nibble's by default (its searches are more accurate than ModelOpt's); `awq_mode="modelopt"` gives
    ModelOpt's own numbers. `calibration_data_reader` feeds every method that calibrates (awq_*, gptq,
    awq_gptq, awq_learned, awq_learned_layer, and any method with mixed_strategy="sensitivity"); given to one that does not, it is
    unused and a warning says so. `use_external_data_format=False` with output_path writes one
    self-contained .onnx: a model over protobuf's 2 GiB is refused (ValueError) and nothing is written at
    output_path. `input_shapes_profile` only serves TensorRT
    execution providers and is ignored. `calibration_eps` other than ModelOpt's default calibrates through
    ONNX Runtime on those providers; left at the default, nibble's own layer engine calibrates wherever it
    can run the model (calibration_engine="ort" asks for ONNX Runtime). Other keywords are ModelOpt's kwargs (awqlite_alpha_step,
    awqlite_run_per_subgraph, awqlite_fuse_nodes, awqclip_alpha_step, awqclip_alpha_min,
    awqclip_bsz_col, enable_mixed_quant, layers_8bit, ...) or any `nibble quantize` flag by name
    (awq_mode="modelopt", format="matmulnbits", threads=4, ...). Raises NibbleError with nibble's
    one-line message when nibble fails."""
    import onnx
    if input_shapes_profile is not None:
        _log.warning("input_shapes_profile is ignored: nibble's calibration sets no TensorRT shape profile")
    with tempfile.TemporaryDirectory(prefix="nibble-") as tmp:
        if isinstance(onnx_path, onnx.ModelProto):
            src = os.path.join(tmp, "in", "model.onnx")
            os.makedirs(os.path.dirname(src))
            onnx.save_model(onnx_path, src, save_as_external_data=True, location="model.onnx.data")
            onnx_path = src
        npz, n = None, 0
        if calibration_data_reader is not None:
            if calibrates(calibration_method, kwargs):
                npz = os.path.join(tmp, "calib.npz")
                n = write_calibration_npz(calibration_data_reader, npz)
            else:
                _log.warning("calibration_data_reader has no effect: %s does not calibrate (a method that does: "
                             "%s, or mixed_strategy='sensitivity')", calibration_method,
                             ", ".join(calibrated_methods()))
        single_file = output_path is not None and not use_external_data_format
        if output_path is None:
            out = os.path.join(tmp, "out", "model.onnx")
        elif single_file:  # quantized beside the output first: its size decides whether one file can hold it
            os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
            out = os.path.join(tempfile.mkdtemp(prefix=".nibble-", dir=os.path.dirname(os.path.abspath(output_path))),
                               "model.onnx")
        else:
            out = os.path.abspath(output_path)
        try:
            _run(_cli_args(os.fspath(onnx_path), out, calibration_method, npz, n, calibration_eps, use_zero_point,
                           block_size, nodes_to_exclude, log_level, kwargs), log_level)
            if output_path is None:
                return onnx.load(out, load_external_data=True)
            if single_file:
                return _save_single_file(out, os.path.abspath(output_path))
            return onnx.load(out, load_external_data=False)
        finally:
            if single_file:
                shutil.rmtree(os.path.dirname(out), ignore_errors=True)


def _save_single_file(quantized: str, output_path: str):
    """The quantized model (graph + the data file it names) as one .onnx at output_path, written under a
    temporary name and renamed; refused when it cannot be one protobuf message."""
    import onnx
    folder = os.path.dirname(quantized)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    if size >= PROTO_LIMIT:
        raise ValueError(f"use_external_data_format=False: the quantized model is {size / 2**30:.2f} GiB, over "
                         f"protobuf's 2 GiB limit for one .onnx file; nothing was written to {output_path} "
                         f"(use use_external_data_format=True)")
    model = onnx.load(quantized, load_external_data=True)
    part = output_path + ".nibble-part"
    onnx.save_model(model, part)
    os.replace(part, output_path)
    return model

#!/usr/bin/env python3
"""Calibration through ONNX Runtime for nibble (spec: calib/README.md).

    capture.py capture --model IN.onnx --out DIR --activations ACTS.json [options]
    capture.py grid --request REQ.json --out DIR
    capture.py serve      (nibble's: one capture or grid per line on stdin, exit codes on fd 3)

`capture` runs the float model with every requested activation added as a graph output, ONE forward
pass per calibration batch for all of them, and streams per-activation statistics into DIR:
mean_abs_np (float32, bit-identical to numpy's np.abs(X).mean(0) over all rows, as ModelOpt computes
x_mean), sum_abs and the Gram matrix X^T X (float64, over the counted rows), plus DIR/index.json.
Memory: one batch of activations + the Gram accumulators of one pass; when those would exceed
--budget_mb the activations are split into groups, one pass over the calibration set per group.

`grid` evaluates ModelOpt's AWQ-lite scale formula (int4.py get_scale) with numpy itself.

This file is the command line and the process around it; capture_run.py does `capture`, scale_grid.py
`grid` (calib/README.md lists every module of calib/).

Bad input: exit 2 and one stderr line 'calibration: ...'.  Progress and warnings: 'calib: ...' lines.
The model's folder is never written to: the graph is loaded without its weights, augmented in memory
and handed to ONNX Runtime as bytes, with the model's folder as the external-data folder.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

REQUIREMENTS = os.path.join(HERE, "requirements.txt")


def _check_requirements(names: tuple[str, ...]) -> None:
    """One line naming what this Python lacks and how to fix it, before any import can fail with a
    traceback (nibble may run a python3 that was never set up for it)."""
    import importlib.util
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        print(f"calibration: the Python {sys.executable} lacks the package(s) {', '.join(missing)}: "
              f"run `{sys.executable} -m pip install -r {REQUIREMENTS}`, or set NIBBLE_PYTHON to a Python "
              f"that has them", file=sys.stderr, flush=True)
        sys.exit(2)


_check_requirements(("numpy", "onnx", "onnxruntime"))

# numpy's BLAS single-threaded on every path (the statistics' threads are ours, StatsRunner): a
# multi-threaded ssyrk rounds differently, and the Gram matrix must not depend on the core count.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

from capture_run import capture  # noqa: E402
from messages import CalibError, first_line  # noqa: E402
from scale_grid import grid  # noqa: E402


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (through main)
        raise CalibError(f"command line: {message}")


def _stats_in_session_default() -> str:
    """NIBBLE_CALIB_STATS_IN_SESSION=auto|on|off: --stats_in_session's default, read here only. nibble
    never passes the option, so this is how a test runs the GPU provider's path (the statistics computed
    in the session) on the CPU provider through `nibble quantize`."""
    v = os.environ.get("NIBBLE_CALIB_STATS_IN_SESSION", "auto").strip().lower() or "auto"
    if v not in ("auto", "on", "off"):
        raise CalibError(f"NIBBLE_CALIB_STATS_IN_SESSION={v}: auto, on or off expected")
    return v


def _add_source_args(c) -> None:
    """The calibration data's options, shared by `capture` and `feeds`."""
    c.add_argument("--dataset", default="cnn", help="cnn | pilevel | FILE.txt | FILE.jsonl | FILE.parquet")
    c.add_argument("--calib_data", default=None, help="FILE.npz of ready model inputs (axis 0 = samples)")
    c.add_argument("--calib_size", type=int, default=32)
    c.add_argument("--seq_len", type=int, default=512)
    c.add_argument("--batch_size", type=int, default=1)
    c.add_argument("--tokenizer", default=None, help="tokenizer.json or its folder (default: beside the model)")
    c.add_argument("--random_calib", action="store_true",
                   help="random token ids (fixed seed) instead of a dataset: --calib_size x --seq_len")
    c.add_argument("--add_position_ids", action="store_true")
    c.add_argument("--no_position_ids", action="store_true")
    c.add_argument("--no_past_kv_inputs", action="store_true")
    c.add_argument("--use_buffer_share", action="store_true")
    c.add_argument("--use_fp32", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="capture.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", parser_class=Parser)
    c = sub.add_parser("capture", help="run the calibration set and write activation statistics")
    c.add_argument("--model", required=True, help="the float ONNX model")
    c.add_argument("--out", required=True, help="output folder (index.json + binaries)")
    c.add_argument("--activations", required=True, help='ACTS.json: [{"name": ..., "K": ...}, ...]')
    _add_source_args(c)
    c.add_argument("--eps", default="cuda,cpu", help="execution providers in order of preference")
    c.add_argument("--mask_padding", type=int, choices=[0, 1], default=0)
    c.add_argument("--budget_mb", type=float, default=2048)
    c.add_argument("--threads", type=int, default=0,
                   help="threads for the statistics (0: all cores): activations are updated side by side, "
                        "each with a single-threaded BLAS")
    c.add_argument("--gram_block", type=int, default=0,
                   help="keep only the block-diagonal of X^T X: [ceil(K/B), B, B] float64 (the last block "
                        "zero-padded), B = this; 0 = the whole K x K matrix")
    c.add_argument("--sample_tokens", type=int, default=0,
                   help="also keep the token rows 0, step, 2*step, ... (step = max(1, T // N), T = all rows of "
                        "all batches, padding included): ModelOpt's awq_clip sample (max_tokens = N); 0 = off")
    c.add_argument("--layer_state", default=None,
                   help="layer by layer: the state folder holding the boundary activations between layers")
    c.add_argument("--layer_groups", default=None,
                   help="layer by layer: GROUPS.json, the activation names of every layer group in order")
    c.add_argument("--layer", type=int, default=-1, help="layer by layer: the group to measure (0-based)")
    c.add_argument("--layer_weights", default=None,
                   help="layer by layer, quantized layers fed forward: the folder of what nibble quantized so "
                        "far (eff_<g>.json); those weights run dequantized, and the boundary for the next group "
                        "is left to --layer_advance")
    c.add_argument("--layer_advance", action="store_true",
                   help="layer by layer: no statistics, only the boundary for the next group, computed with "
                        "--layer_weights")
    c.add_argument("--stats_in_session", choices=["auto", "on", "off"], default=_stats_in_session_default(),
                   help="compute the statistics (what the algorithm keeps of X^T X, the |x| sums) inside the "
                        "ONNX Runtime session (on the provider's device) instead of with numpy on the host; "
                        "auto: on for a provider other than CPU. Default: $NIBBLE_CALIB_STATS_IN_SESSION, "
                        "else auto")
    f = sub.add_parser("feeds", help="write the calibration batches' model inputs (nibble's layer engine runs them)")
    f.add_argument("--model", required=True, help="the float ONNX model")
    f.add_argument("--out", required=True, help="output folder: batches.json and one folder of arrays per batch")
    _add_source_args(f)
    g = sub.add_parser("grid", help="ModelOpt's AWQ-lite scale grid computed with numpy")
    g.add_argument("--request", required=True)
    g.add_argument("--out", required=True)
    return p


def _die_with_parent() -> None:
    """A nibble killed while this runs takes this process with it (Linux), rather than leaving it writing
    into a temporary folder that the next run removes."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the call
            os._exit(1)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    _die_with_parent()
    try:
        a = build_parser().parse_args(argv)
        if a.cmd == "capture":
            try:
                import onnxruntime as ort
                ort.set_default_logger_severity(3)
            except ImportError:
                raise CalibError("the Python package 'onnxruntime' is not installed") from None
            return capture(a)
        if a.cmd == "grid":
            return grid(a)
        if a.cmd == "feeds":
            from feeds_dump import dump_feeds
            return dump_feeds(a)
        raise CalibError("command line: a subcommand is needed: capture, feeds or grid")
    except CalibError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"calibration: {msg}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("calibration: interrupted", file=sys.stderr, flush=True)
        return 130
    except MemoryError:
        print("calibration: out of memory (try a smaller --batch_size or --budget_mb)", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # noqa: BLE001 - never a traceback
        if os.environ.get("NIBBLE_CALIB_TRACEBACK"):
            import traceback
            traceback.print_exc()
        print(f"calibration: internal error: {type(e).__name__}: {first_line(e)}", file=sys.stderr, flush=True)
        return 2


def _trim_heap() -> None:
    """Gives the heap's free pages back (glibc malloc_trim): a long-lived process that holds a layer's
    arrays and ONNX Runtime session at a time would otherwise keep the high-water mark of every request."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def serve() -> int:
    """`capture.py serve` (what nibble runs, calib/capture_server.cc): one request per line on stdin, a JSON
    array of the arguments of one `capture` or `grid` command, run as main() runs them; after each, its
    exit code as one line on fd 3 (stderr carries the same lines as a child of its own would write).
    The imports and ONNX Runtime's start are paid once for a whole layer-by-layer run. Ends at EOF."""
    import gc
    import json
    _die_with_parent()
    replies = os.fdopen(3, "w", buffering=1)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            rc = main(json.loads(line))
        except SystemExit as e:  # argparse's --help
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # noqa: BLE001 - a request that is not a JSON array
            print(f"calibration: internal error: bad request ({first_line(e)})", file=sys.stderr, flush=True)
            rc = 2
        gc.collect()   # one layer's arrays and session gone before the next request
        _trim_heap()
        sys.stderr.flush()
        replies.write(f"{rc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["serve"] else main())

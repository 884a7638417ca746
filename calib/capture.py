#!/usr/bin/env python3
"""Calibration through ONNX Runtime for nibble (spec: calib/README.md).

    capture.py capture --model IN.onnx --out DIR --activations ACTS.json [options]
    capture.py grid --request REQ.json --out DIR

`capture` runs the float model with every requested activation added as a graph output, ONE forward
pass per calibration batch for all of them, and streams per-activation statistics into DIR:
mean_abs_np (float32, bit-identical to numpy's np.abs(X).mean(0) over all rows, as ModelOpt computes
x_mean), sum_abs and the Gram matrix X^T X (float64, over the counted rows), plus DIR/index.json.
Memory: one batch of activations + the Gram accumulators of one pass; when those would exceed
--budget_mb the activations are split into groups, one pass over the calibration set per group.

`grid` evaluates ModelOpt's AWQ-lite scale formula (int4.py get_scale) with numpy itself.

Bad input: exit 2 and one stderr line 'calibration: ...'.  Progress and warnings: 'calib: ...' lines.
The model's folder is never written to: the graph is loaded without its weights, augmented in memory
and handed to ONNX Runtime as bytes, with the model's folder as the external-data folder.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import sys
import time
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

import numpy as np  # noqa: E402

from calib_inputs import NpzBatches, random_batches, text_batches  # noqa: E402
from messages import CalibError, warn  # noqa: E402
from model_feeds import FeedOptions, model_inputs  # noqa: E402

INDEX_VERSION = 1

# --eps names (ModelOpt's calibration_eps) -> ONNX Runtime providers
EPS = {
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
    "dml": "DmlExecutionProvider",
    "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}


def log(msg: str) -> None:
    print(f"calib: {msg}", file=sys.stderr, flush=True)


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else type(e).__name__)[:400]


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (through main)
        raise CalibError(f"command line: {message}")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="capture.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", parser_class=Parser)
    c = sub.add_parser("capture", help="run the calibration set and write activation statistics")
    c.add_argument("--model", required=True, help="the float ONNX model")
    c.add_argument("--out", required=True, help="output folder (index.json + binaries)")
    c.add_argument("--activations", required=True, help='ACTS.json: [{"name": ..., "K": ...}, ...]')
    c.add_argument("--dataset", default="cnn", help="cnn | pilevel | FILE.txt | FILE.jsonl | FILE.parquet")
    c.add_argument("--calib_data", default=None, help="FILE.npz of ready model inputs (axis 0 = samples)")
    c.add_argument("--calib_size", type=int, default=32)
    c.add_argument("--seq_len", type=int, default=512)
    c.add_argument("--batch_size", type=int, default=1)
    c.add_argument("--tokenizer", default=None, help="tokenizer.json or its folder (default: beside the model)")
    c.add_argument("--eps", default="cuda,cpu", help="execution providers in order of preference")
    c.add_argument("--random_calib", action="store_true",
                   help="random token ids (fixed seed) instead of a dataset: --calib_size x --seq_len")
    c.add_argument("--add_position_ids", action="store_true")
    c.add_argument("--no_position_ids", action="store_true")
    c.add_argument("--no_past_kv_inputs", action="store_true")
    c.add_argument("--use_buffer_share", action="store_true")
    c.add_argument("--use_fp32", action="store_true")
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
    c.add_argument("--stats_in_session", choices=["auto", "on", "off"], default="auto",
                   help="compute X^T X and the |x| sums inside the ONNX Runtime session (on the provider's "
                        "device) instead of with numpy on the host; auto: on for a provider other than CPU")
    g = sub.add_parser("grid", help="ModelOpt's AWQ-lite scale grid computed with numpy")
    g.add_argument("--request", required=True)
    g.add_argument("--out", required=True)
    return p


# --------------------------------------------------------------------------------------------
# Execution providers
# --------------------------------------------------------------------------------------------

def parse_eps(spec: str) -> list[tuple[str, str, dict]]:
    """'cuda:1,cpu' -> [(token, provider, options), ...]; unknown names are an error."""
    out = []
    for tok in [t.strip() for t in spec.split(",") if t.strip()]:
        base, _, dev = tok.partition(":")
        prov = EPS.get(base.lower())
        if prov is None:
            raise CalibError(f"--eps: unknown execution provider '{tok}' (known: cuda, cpu, dml, NvTensorRtRtx, trt)")
        opts = {}
        if dev:
            if not dev.isdigit():
                raise CalibError(f"--eps: '{tok}': the device id after ':' must be a number")
            opts["device_id"] = dev
        out.append((tok, prov, opts))
    if not out:
        raise CalibError("--eps: no execution provider given")
    return out


def select_providers(spec: str) -> list[tuple[str, dict]]:
    import onnxruntime as ort
    avail = ort.get_available_providers()
    chosen = []
    for tok, prov, opts in parse_eps(spec):
        if prov not in avail:
            warn(f"execution provider '{tok}' ({prov}) is not available in this onnxruntime; trying the next")
            continue
        if prov not in [p for p, _ in chosen]:
            chosen.append((prov, opts))
    if not chosen:
        raise CalibError(f"--eps {spec}: none of these execution providers is available "
                         f"(this onnxruntime has: {', '.join(avail)})")
    return chosen


# --------------------------------------------------------------------------------------------
# The augmented graph
# --------------------------------------------------------------------------------------------

def _subgraph_refs(node, acc: set) -> None:
    """Every tensor name a node's subgraphs read (over-inclusive: outer-scope names are among them)."""
    from onnx import AttributeProto
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for n in g.node:
                acc.update(x for x in n.input if x)
                _subgraph_refs(n, acc)


def augmented_model_bytes(model, outputs: list[str]) -> bytes:
    """The model with `outputs` as its only graph outputs and only the nodes they depend on."""
    import onnx
    g = model.graph
    producer = {}
    for i, n in enumerate(g.node):
        for o in n.output:
            if o:
                producer[o] = i
    need_nodes = set()
    stack = [producer[o] for o in outputs if o in producer]
    while stack:
        i = stack.pop()
        if i in need_nodes:
            continue
        need_nodes.add(i)
        refs = set(x for x in g.node[i].input if x)
        _subgraph_refs(g.node[i], refs)
        stack.extend(producer[r] for r in refs if r in producer and producer[r] not in need_nodes)
    kept = [g.node[i] for i in sorted(need_nodes)]
    used = set()
    for n in kept:
        used.update(x for x in n.input if x)
        _subgraph_refs(n, used)
    input_names = {vi.name for vi in g.input}

    ng = onnx.GraphProto()
    ng.name = g.name
    ng.doc_string = g.doc_string
    ng.node.extend(kept)
    ng.initializer.extend(t for t in g.initializer if t.name in used or t.name in input_names)
    ng.sparse_initializer.extend(g.sparse_initializer)
    ng.input.extend(g.input)
    ng.value_info.extend(g.value_info)
    for o in outputs:
        ng.output.append(onnx.ValueInfoProto(name=o))
    nm = onnx.ModelProto()
    for fd, val in model.ListFields():          # everything but the graph (opsets, functions, metadata)
        if fd.name == "graph":
            continue
        if hasattr(val, "extend"):              # repeated field
            getattr(nm, fd.name).extend(val)
        elif hasattr(val, "CopyFrom"):          # message
            getattr(nm, fd.name).CopyFrom(val)
        else:
            setattr(nm, fd.name, val)
    nm.graph.CopyFrom(ng)
    try:
        return nm.SerializeToString()
    except Exception as e:  # noqa: BLE001 - protobuf's 2 GiB limit
        raise CalibError(f"the model's graph cannot be serialized ({first_line(e)}): weights stored inline "
                         f"beyond protobuf's 2 GiB limit? Store them as external data") from None


def _release_large_blocks() -> None:
    """glibc: blocks of 4 MiB and more are mmap'ed and so go back to the system when freed (the dynamic
    threshold would otherwise rise and keep ONNX Runtime's freed weight casts in the heap)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, 4 * 2**20)   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def make_session(model_bytes: bytes, model_dir: str, providers: list[tuple[str, dict]], model_path: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # as ModelOpt
    so.log_severity_level = 3
    # No arena and no memory pattern: on CPU, ONNX Runtime runs an fp16 model's MatMuls in fp32 and casts
    # every weight at every run; its arena keeps the high-water mark of those casts (SmolLM2-135M fp16:
    # 969 MB peak with the arena, 630 MB without, the same speed with large blocks mmap'ed, see
    # _release_large_blocks; fp32: 639 / 630 MB).
    so.enable_cpu_mem_arena = False
    so.enable_mem_pattern = False
    # Priority-based order runs each weight's Cast just before its MatMul; the default order starts with
    # all of them (no inputs to wait for), so every fp32 cast is alive at once (fp16: 630 -> 447 MB).
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", model_dir)
    # ORT's threads would spin while numpy/BLAS computes the statistics between runs
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    names = [p for p, _ in providers]
    opts = [o for _, o in providers]
    try:
        sess = ort.InferenceSession(model_bytes, so, providers=names, provider_options=opts)
    except Exception as e:  # noqa: BLE001 - ORT's exceptions (Fail, InvalidGraph, ...)
        raise CalibError(f"{model_path}: ONNX Runtime cannot load the model ({first_line(e)})") from None
    got = sess.get_providers()
    if got and got[0] != names[0]:
        warn(f"{names[0]} could not be used; running on {got[0]}")
    return sess


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

class _Syrk:
    """G += X^T X on the upper triangle, in place: BLAS ssyrk from the OpenBLAS that numpy's wheel
    bundles (no K*K temporary, no symmetrising copy, no extra add), checked once against numpy.
    Falls back to numpy's X.T @ X (itself a syrk, plus copies) when that library is not found."""

    def __init__(self):
        self.fn = None
        if os.environ.get("NIBBLE_CALIB_NUMPY_GRAM"):      # tests: numpy's path
            return
        try:
            import ctypes
            import glob
            libs = sorted(glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs",
                                                 "libscipy_openblas64_*.so*")))
            if not libs:
                return
            fn = ctypes.CDLL(libs[0]).scipy_cblas_ssyrk64_
            fn.restype = None
            i64, cint = ctypes.c_int64, ctypes.c_int
            fn.argtypes = [cint, cint, cint, i64, i64, ctypes.c_float, ctypes.c_void_p, i64, ctypes.c_float,
                           ctypes.c_void_p, i64]
            self.fn = fn
            x = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
            g = np.zeros((5, 5), np.float32)
            self.add(g, x)
            self.add(g, x[2:])
            want = x.T @ x + x[2:].T @ x[2:]
            if not np.allclose(np.triu(g), np.triu(want), rtol=1e-5, atol=1e-5) or np.tril(g, -1).any():
                self.fn = None
        except Exception:  # noqa: BLE001 - any problem: numpy's path
            self.fn = None

    def add(self, G: np.ndarray, X: np.ndarray) -> None:
        """G (C-contiguous float32 [K, K]) += X^T X for X float32 [R, K]; upper triangle only with BLAS
        (call full() at the end), the whole matrix with numpy."""
        if self.fn is None:
            G += X.T @ X
            return
        X = np.ascontiguousarray(X, dtype=np.float32)
        R, K = X.shape
        # CblasRowMajor = 101, CblasUpper = 121, CblasTrans = 112: C = 1 * A^T A + 1 * C, A [R, K]
        self.fn(101, 121, 112, K, R, 1.0, X.ctypes.data, K, 1.0, G.ctypes.data, K)

    def full(self, G: np.ndarray) -> np.ndarray:
        if self.fn is None:
            return G
        il = np.tril_indices(G.shape[0], -1)
        G[il] = G.T[il]
        return G


SYRK = _Syrk()


class Accumulator:
    """Statistics of one activation over the calibration set.

    mean_abs_np: float32 running sum of |x| row after row in token order, each batch folded in with
    one np.add.reduce over [running sum; |rows|] (numpy reduces axis 0 of a C-contiguous 2-D float
    array row by row, so this is the very same sequence of float32 additions that
    np.abs(concatenate(all)).reshape(-1, K).mean(0) performs), divided as numpy's mean divides
    (true_divide by the intp row count).  K == 1 is the exception (numpy then sums pairwise): its
    column is kept and reduced by numpy at the end.
    sum_abs: float64 over the counted rows.
    gram: X^T X over the counted rows, accumulated in float32 by one ssyrk per GRAM_ROWS buffered rows
    (float32 keeps the ~1e-6 the loss search needs), written as float64.  With every ssyrk single-threaded
    and the activations side by side (StatsRunner), 256 rows run as fast as 1024 did (SmolLM2 fp32,
    32 x 256 tokens: 15.3-16.4 s either way) and the buffers take a quarter of the memory (peak 1484 ->
    1190 MB)."""

    GRAM_ROWS = 256

    def __init__(self, name: str, K: int, with_gram: bool = True, gram_block: int = 0):
        self.name, self.K = name, K
        self.gram_block = gram_block
        if gram_block > 0:
            with_gram = False
            # float32, like the whole Gram matrix (written as float64): half the memory of the calibration
            # child's largest state for awq_clip
            self.gblocks = np.zeros((-(-K // gram_block), gram_block, gram_block), np.float32)
        self.acc32 = np.zeros(K, np.float32)
        self.rows_all = 0
        self.col1: list[np.ndarray] = []
        self.sum_abs = np.zeros(K, np.float64)
        self.gram = np.zeros((K, K), np.float32) if with_gram else None
        self.buf = None   # made on first use: a batch of exactly GRAM_ROWS rows never needs it
        self.nbuf = 0
        self.rows = 0
        self.nonfinite = 0
        self.reduced = False   # statistics from the session: mean_abs_np is the float32 sum / rows

    def update(self, X: np.ndarray, counted: np.ndarray | None) -> None:
        """X [R, K] (float32 or float16), counted: bool [R] or None (= all rows)."""
        K = self.K
        R = X.shape[0]
        if R == 0:
            return
        if K == 1:
            self.col1.append(np.abs(X).astype(np.float32) if X.dtype == np.float16 else np.abs(X))
        else:
            buf = np.empty((R + 1, K), np.float32)
            buf[0] = self.acc32
            np.abs(X, out=buf[1:]) if X.dtype == np.float32 else np.copyto(buf[1:], np.abs(X))
            self.acc32 = np.add.reduce(buf, axis=0)
            del buf
        self.rows_all += R
        Xc = X if counted is None else X[counted]
        Xd = np.asarray(Xc, dtype=np.float64)
        if Xd.shape[0]:
            self.sum_abs += np.add.reduce(np.abs(Xd), axis=0)
            if self.gram is not None:
                self._buffer(Xc)
            elif self.gram_block > 0:
                X32 = np.ascontiguousarray(Xc, dtype=np.float32)
                B = self.gram_block
                for g in range(self.gblocks.shape[0]):
                    xb = X32[:, g * B:(g + 1) * B]
                    kb = xb.shape[1]
                    self.gblocks[g, :kb, :kb] += xb.T @ xb
            if not np.isfinite(self.sum_abs).all():
                self.nonfinite += 1
        self.rows += Xd.shape[0]

    def update_reduced(self, gram: np.ndarray, sum_counted: np.ndarray, sum_all: np.ndarray, rows_all: int,
                       rows: int) -> None:
        """One batch's statistics computed in the session (session_stats.py): float32 XᵀX of the counted
        rows and column sums of |x|, summed here in the accumulators' types."""
        self.acc32 = self.acc32 + sum_all.astype(np.float32)
        self.reduced = True
        self.rows_all += rows_all
        self.sum_abs += sum_counted.astype(np.float64)
        if self.gram is not None:
            self.gram += gram
        elif self.gram_block > 0:
            B = self.gram_block
            for g in range(self.gblocks.shape[0]):
                kb = min(B, self.K - g * B)
                self.gblocks[g, :kb, :kb] += gram[g * B:g * B + kb, g * B:g * B + kb]
        if not np.isfinite(self.sum_abs).all():
            self.nonfinite += 1
        self.rows += rows

    def _buffer(self, X: np.ndarray) -> None:
        # Rows go to ssyrk GRAM_ROWS at a time, in order. A whole group of them already side by side in X
        # (a batch of 1 x 256 tokens) goes straight from X: the same ssyrk on the same rows, without a
        # copy, and none of the buffers (SmolLM2: 120 of them, 100 MB) is ever made.
        i = 0
        while i < X.shape[0]:
            if self.nbuf == 0 and X.shape[0] - i >= self.GRAM_ROWS:
                SYRK.add(self.gram, np.ascontiguousarray(X[i:i + self.GRAM_ROWS], dtype=np.float32))
                i += self.GRAM_ROWS
                continue
            if self.buf is None:
                self.buf = np.empty((self.GRAM_ROWS, self.K), np.float32)
            n = min(X.shape[0] - i, self.GRAM_ROWS - self.nbuf)
            self.buf[self.nbuf:self.nbuf + n] = X[i:i + n]
            self.nbuf += n
            i += n
            if self.nbuf == self.GRAM_ROWS:
                self._flush()

    def _flush(self) -> None:
        if self.nbuf:
            SYRK.add(self.gram, self.buf[:self.nbuf])
            self.nbuf = 0

    def gram_f64(self) -> np.ndarray:
        """The finished Gram matrix (float64, symmetric); frees the float32 state."""
        self._flush()
        g = SYRK.full(self.gram).astype(np.float64)
        self.gram = self.buf = None
        return g

    def mean_abs_np(self) -> np.ndarray:
        if self.K == 1 and not self.reduced:
            col = np.concatenate(self.col1).reshape(-1, 1) if self.col1 else np.zeros((0, 1), np.float32)
            return col.mean(0).astype(np.float32)
        out = np.empty(self.K, np.float32)
        np.true_divide(self.acc32, np.intp(self.rows_all), out=out, casting="unsafe")
        return out


class StatsRunner:
    """Folds one batch into every activation's Accumulator, activations side by side on `threads`
    threads, each BLAS call single-threaded.  Most of a batch's statistics are many small ssyrk calls
    (K = 576 on SmolLM2), where one thread per activation is about twice as fast as two threads inside
    each call.  Every accumulator is touched by one thread at a time and adds its rows in the same
    order, so the statistics do not depend on the thread count."""

    def __init__(self, threads: int):
        self.threads = max(1, threads or len(os.sched_getaffinity(0)) or 1)
        self.pool = None   # numpy's BLAS is single-threaded (OPENBLAS_NUM_THREADS, set at import)
        if self.threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="calib-stats")

    @staticmethod
    def _one(acc: "Accumulator", X: np.ndarray, counted) -> None:
        with np.errstate(all="ignore"):
            acc.update(X, counted)

    def run(self, accs: dict, work: list) -> None:
        if self.pool is None:
            for i, X, counted in work:
                self._one(accs[i], X, counted)
            return
        # larger activations first: the threads finish together
        order = sorted(work, key=lambda w: -w[1].shape[1])
        futures = [self.pool.submit(self._one, accs[i], X, counted) for i, X, counted in order]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for f in futures:   # a failed update ends the run: drop what has not started
                f.cancel()
            raise

    @staticmethod
    def run_reduced(accs: dict, group: list, acts, sess, fetch: list, feeds: dict, counted, samplers: dict,
                    model_path: str, bi: int) -> None:
        """One batch with the statistics computed by the session (session_stats.py)."""
        from session_stats import COUNTED, SUFFIXES, counted_column, numpy_stats
        outs = [n + sfx for n in fetch for sfx in SUFFIXES] + (list(fetch) if samplers else [])
        got = {}
        if sess is not None:
            try:
                got = dict(zip(outs, sess.run(outs, {**feeds, COUNTED: counted_column(counted)})))
            except Exception as e:  # noqa: BLE001
                raise CalibError(f"{model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                                 f"({first_line(e)})") from None
        for i in group:
            name, K = acts[i]
            if name in got or name + SUFFIXES[0] in got:
                gram, s_cnt, s_all, shape = (got.pop(name + sfx) for sfx in SUFFIXES)
                R = int(shape[0])
                if int(shape[1]) != K:
                    raise CalibError(f"{model_path}: activation '{name}' has last dimension {int(shape[1])}, "
                                     f"not K = {K} (--activations)")
            else:   # a graph input: the feed itself
                X = np.asarray(feeds[name]).reshape(-1, K)
                R = X.shape[0]
                gram, s_cnt, s_all = numpy_stats(X, counted if counted is not None and counted.size == R else None)
            if counted is not None and counted.size != R:
                raise CalibError(f"{model_path}: activation '{name}' has {R} rows per batch, the attention mask "
                                 f"{counted.size} tokens: --mask_padding 1 cannot tell its padding rows")
            if samplers:
                x = got.pop(name) if name in got else np.asarray(feeds[name])
                samplers[i].update(x.reshape(-1, K), name)
            with np.errstate(all="ignore"):
                accs[i].update_reduced(gram, s_cnt, s_all, R, R if counted is None else int(counted.sum()))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


class TokenSampler:
    """ModelOpt's awq_clip token sample (int4.py _clip_search): X = every batch's activation reshaped
    [-1, K] and concatenated (all rows, padding included), then X[0::max(1, T // max_tokens)].  T is
    known from the first batch (every batch has the same rows: npz samples share a shape, texts are
    padded to --seq_len).  Keeps only the sampled rows (64..127 of them), as float32."""

    def __init__(self, max_tokens: int, n_batches: int):
        self.max_tokens, self.n_batches = max_tokens, n_batches
        self.per_batch = None
        self.step = 0
        self.offset = 0
        self.dtype = "float32"
        self.parts: list[np.ndarray] = []

    def update(self, X: np.ndarray, name: str) -> None:
        R = X.shape[0]
        if self.per_batch is None:
            self.per_batch = R
            self.step = max(1, (R * self.n_batches) // self.max_tokens)
            self.dtype = str(X.dtype)
        elif R != self.per_batch:
            raise CalibError(f"activation '{name}': batches of {self.per_batch} and {R} rows; the token sample "
                             f"(awq_clip) needs batches of one shape")
        first = (-self.offset) % self.step
        if first < R:
            self.parts.append(np.array(X[first::self.step], dtype=np.float32))
        self.offset += R

    def rows(self, K: int) -> np.ndarray:
        return np.concatenate(self.parts, axis=0) if self.parts else np.zeros((0, K), np.float32)


def group_by_budget(acts: list[tuple[str, int]], budget_bytes: float, gram_block: int = 0) -> list[list[int]]:
    groups: list[list[int]] = []
    cur, size = [], 0
    for i, (name, K) in enumerate(acts):
        if gram_block > 0:
            b = -(-K // gram_block) * gram_block * gram_block * 4      # float32 accumulators
        else:
            b = K * K * 4 + Accumulator.GRAM_ROWS * K * 4     # float32 Gram + its row buffer
        if cur and size + b > budget_bytes:
            groups.append(cur)
            cur, size = [], 0
        if b > budget_bytes:
            warn(f"activation '{name}': its Gram matrix alone ({b / 2**20:.1f} MiB) exceeds --budget_mb")
        cur.append(i)
        size += b
    if cur:
        groups.append(cur)
    return groups


# --------------------------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------------------------

def read_activations(path: str) -> list[tuple[str, int]]:
    if not os.path.isfile(path):
        raise CalibError(f"--activations {path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        raise CalibError(f"--activations {path}: not JSON ({first_line(e)})") from None
    if not isinstance(v, list) or not v:
        raise CalibError(f"--activations {path}: a non-empty list of {{\"name\": ..., \"K\": ...}} expected")
    out, seen = [], {}
    for i, e in enumerate(v):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"] \
                or not isinstance(e.get("K"), int) or isinstance(e.get("K"), bool) or e["K"] <= 0:
            raise CalibError(f"--activations {path}: entry {i} is not {{\"name\": string, \"K\": positive int}}")
        name, K = e["name"], e["K"]
        if name in seen:
            if seen[name] != K:
                raise CalibError(f"--activations {path}: '{name}' is listed with K {seen[name]} and K {K}")
            continue
        seen[name] = K
        out.append((name, K))
    return out


def load_graph(path: str):
    import onnx
    if not os.path.exists(path):
        raise CalibError(f"--model {path}: file not found")
    if not os.path.isfile(path):
        raise CalibError(f"--model {path}: not a file")
    try:
        return onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - DecodeError, ...
        raise CalibError(f"--model {path}: not an ONNX model ({first_line(e)})") from None


def check_activations(model, acts, model_path):
    g = model.graph
    produced = {o for n in g.node for o in n.output if o}
    inputs = {vi.name for vi in g.input}
    inits = {t.name for t in g.initializer}
    for name, _ in acts:
        if name in produced:
            continue
        if name in inputs and name not in inits:
            continue
        if name in inits:
            raise CalibError(f"{model_path}: '{name}' (--activations) is an initializer, not an activation")
        raise CalibError(f"{model_path}: no tensor named '{name}' (--activations) in the graph")


def _write(path: str, arr: np.ndarray, dtype: str) -> None:
    tmp = path + ".tmp"
    np.ascontiguousarray(arr, dtype=dtype).tofile(tmp)
    os.replace(tmp, path)


class _Layered:
    """capture's view of one layer group (calib/layers.py): its batches come from the state folder,
    its session is the group's segment, and what crosses into the next segment is saved per batch."""

    def __init__(self, a, model, acts):
        from layers import LayerCut, read_groups
        groups = read_groups(a.layer_groups)
        if not 0 <= a.layer < len(groups):
            raise CalibError(f"--layer {a.layer}: --layer_groups has {len(groups)} groups")
        if sorted(groups[a.layer]) != sorted(n for n, _ in acts):
            raise CalibError(f"--layer {a.layer}: --activations and group {a.layer} of --layer_groups differ")
        self.a, self.model = a, model
        self.cut = LayerCut(model, groups)
        from layers import effective_weights
        self.eff = effective_weights(a.layer_weights)
        # quantized layers fed forward: the statistics run leaves the boundary to the advance run
        self.writes_next = a.layer_advance or not a.layer_weights

    def open(self, source_batches):
        from layers import LayerBatches
        self.lb = LayerBatches(self.a.layer_state, self.cut, self.a.layer, source_batches)
        for k in ("n_batches", "samples", "batch_size", "seq_len", "source"):
            setattr(self, k, getattr(self.lb, k))

    def __iter__(self):
        return iter(self.lb)

    @property
    def tokens(self):
        return self.lb.tokens

    def fetch(self, names, carry):
        s = self.a.layer
        own = [n for n in names if self.cut.produced_in.get(n, -1) == s]
        if carry and self.writes_next:
            self.lb.begin_next()
            own += [t for t in self.lb.carry if t not in own]
        return own

    def inputs(self, feeds):
        """The feeds the segment reads (the boundary holds what later segments need too)."""
        return {t: feeds[t] for t in self.seg_inputs}

    def model_bytes(self, fetch):
        b = self.cut.model_bytes(self.model, self.a.layer, self.lb.in_types, fetch, self.eff)
        if self.cut.substituted:
            log(f"layer group {self.a.layer}: {self.cut.substituted} weight(s) run dequantized")
        self.seg_inputs = self.cut.last_inputs
        return b

    def save_next(self, bi, feeds, mask, got):
        if not self.writes_next:
            return
        self.lb.save_next(bi, feeds, mask, got)
        for t in self.lb.carry:     # not an activation of this group: not counted below
            if t not in self.names:
                got.pop(t, None)

    def finish_next(self):
        if self.writes_next:
            self.lb.finish_next()

    def advance(self, model_dir, providers, model_path):
        """--layer_advance: the group's segment run once more, only for the boundary of the next group."""
        fetch = [] if self.lb.last else list(self.lb.carry)
        if not fetch:
            return False
        self.lb.begin_next()
        sess = None
        for bi, (feeds, mask) in enumerate(self):
            if sess is None:
                sess = make_session(self.model_bytes(fetch), model_dir, providers, model_path)
            try:
                vals = sess.run(fetch, self.inputs(feeds))
            except Exception as e:  # noqa: BLE001
                raise CalibError(f"{model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                                 f"({first_line(e)})") from None
            self.lb.save_next(bi, feeds, mask, dict(zip(fetch, vals)))
        self.lb.finish_next()
        return True


def layer_mode(a, model, acts):
    if a.layer_state is None:
        return None
    if a.layer_groups is None or a.layer < 0:
        raise CalibError("--layer_state needs --layer_groups and --layer")
    lay = _Layered(a, model, acts)
    lay.names = {n for n, _ in acts}
    return lay


def count_tokens(tt: int, tu: int, tok_mask, flat_mask, feeds) -> tuple[int, int]:
    """Tokens so far (all, unpadded) after one more batch."""
    if tok_mask is not None:
        return tt + tok_mask.size, tu + int(flat_mask.sum())
    if "input_ids" in feeds:
        return tt + feeds["input_ids"].size, tu + feeds["input_ids"].size
    return tt, tu


def log_batch(gi: int, passes: int, bi: int, n_batches: int, t1: float, t2: float, t3: float) -> None:
    log(f"pass {gi + 1}/{passes} batch {bi + 1}/{n_batches}: run {t2 - t1:.2f} s, stats {t3 - t2:.2f} s")


def session_model_bytes(cut: bytes, acts: list[tuple[str, int]], keep_rows: bool) -> bytes:
    import onnx
    from session_stats import add_stat_outputs
    return add_stat_outputs(onnx.load_from_string(cut), acts, keep_rows).SerializeToString()


def capture(a) -> int:
    t0 = time.time()
    if a.calib_size < 1 or a.seq_len < 1 or a.batch_size < 1:
        raise CalibError("--calib_size, --seq_len and --batch_size must be >= 1")
    if a.batch_size > a.calib_size:
        raise CalibError(f"--batch_size {a.batch_size} is larger than --calib_size {a.calib_size}")
    if not (a.budget_mb > 0):
        raise CalibError("--budget_mb must be > 0")
    if a.no_position_ids and a.add_position_ids:
        raise CalibError("--add_position_ids and --no_position_ids contradict each other")
    model_path = a.model
    model_dir = os.path.dirname(os.path.abspath(model_path))
    out_dir = os.path.abspath(a.out)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CalibError(f"--out {a.out}: exists and is not a folder")
    acts = read_activations(a.activations)
    model = load_graph(model_path)
    if os.path.realpath(out_dir) == os.path.realpath(model_dir):
        raise CalibError(f"--out {a.out}: is the model's folder; calibration never writes next to the model")
    check_activations(model, acts, model_path)
    specs = model_inputs(model)
    opts = FeedOptions(a.add_position_ids, a.no_position_ids, a.no_past_kv_inputs, a.use_buffer_share, a.use_fp32)

    if a.calib_data and a.random_calib:
        raise CalibError("--calib_data and --use_random_calib contradict each other (give one)")

    def source_batches():
        if a.random_calib:
            return random_batches(model, model_path, specs, opts, a.calib_size, a.seq_len, a.batch_size)
        if a.calib_data:
            return NpzBatches(a.calib_data, model_path, specs, opts, a.calib_size, a.batch_size)
        return text_batches(model_path, specs, opts, a.dataset, a.tokenizer, a.calib_size, a.seq_len,
                            a.batch_size)
    layered = layer_mode(a, model, acts)
    batches = layered if layered is not None else source_batches()
    if layered is not None:
        layered.open(source_batches)
    if layered is not None and a.layer_advance:
        if layered.advance(model_dir, select_providers(a.eps), model_path):
            log(f"layer group {a.layer}: boundary for the next group written, {time.time() - t0:.1f} s")
        return 0
    providers = select_providers(a.eps)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot create the folder ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK):
        raise CalibError(f"--out {a.out}: folder not writable")

    if a.gram_block < 0:
        raise CalibError("--gram_block must be >= 0")
    groups = group_by_budget(acts, a.budget_mb * 2**20, a.gram_block)
    # A GPU provider computes the statistics itself (session_stats.py); the CPU keeps numpy's exact order.
    in_session = a.stats_in_session == "on" or (a.stats_in_session == "auto" and
                                                providers[0][0] != "CPUExecutionProvider")
    if in_session and layered is not None:   # not combined yet: the segment's statistics go through numpy
        if a.stats_in_session == "on":
            warn("--stats_in_session on: no effect layer by layer (the statistics are computed with numpy)")
        in_session = False
    stats = StatsRunner(a.threads)
    _release_large_blocks()
    graph_inputs = {vi.name for vi in model.graph.input}
    log(f"{len(acts)} activations, {batches.samples} samples in {batches.n_batches} batches of "
        f"{batches.batch_size} from {batches.source}, {len(groups)} pass(es), providers "
        f"{','.join(p for p, _ in providers)}")

    entries: list[dict | None] = [None] * len(acts)
    provider_used = None
    tokens_total = tokens_unpadded = 0
    for gi, group in enumerate(groups):
        names = [acts[i][0] for i in group]
        fetch = [n for n in names if n not in graph_inputs]
        sess = None
        samplers = {i: TokenSampler(a.sample_tokens, batches.n_batches) for i in group} if a.sample_tokens > 0 else {}
        if layered is not None:
            fetch = layered.fetch(names, carry=gi == 0)
        elif fetch:
            cut = augmented_model_bytes(model, fetch)
            if in_session:
                cut = session_model_bytes(cut, [(n, K) for n, K in (acts[i] for i in group) if n in fetch],
                                          bool(samplers))
            sess = make_session(cut, model_dir, providers, model_path)
            provider_used = provider_used or sess.get_providers()[0]
        accs = {i: Accumulator(acts[i][0], acts[i][1], gram_block=a.gram_block) for i in group}
        tt = tu = 0
        for bi, (feeds, tok_mask) in enumerate(batches):
            t1 = time.time()
            if layered is not None and sess is None and fetch:
                sess = make_session(layered.model_bytes(fetch), model_dir, providers, model_path)
                provider_used = provider_used or sess.get_providers()[0]
            flat_mask = None if tok_mask is None else (np.asarray(tok_mask) != 0).reshape(-1)
            if in_session:
                counted = flat_mask if a.mask_padding and flat_mask is not None and not flat_mask.all() else None
                stats.run_reduced(accs, group, acts, sess, fetch, feeds, counted, samplers, model_path, bi)
                log_batch(gi, len(groups), bi, batches.n_batches, t1, time.time(), time.time())
                tt, tu = count_tokens(tt, tu, tok_mask, flat_mask, feeds)
                continue
            if sess is not None:
                try:
                    vals = sess.run(fetch, feeds if layered is None else layered.inputs(feeds))
                except Exception as e:  # noqa: BLE001
                    raise CalibError(f"{model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                                     f"({first_line(e)})") from None
                got = dict(zip(fetch, vals))
                del vals
            else:
                got = {}
            t2 = time.time()
            if layered is not None and gi == 0:
                layered.save_next(bi, feeds, tok_mask, got)
            if layered is not None and tok_mask is None:   # the boundary carries the token count
                tt, tu = tt + layered.tokens, tu + layered.tokens
            else:
                tt, tu = count_tokens(tt, tu, tok_mask, flat_mask, feeds)
            work = []
            for i in group:
                name, K = acts[i]
                x = got.pop(name) if name in got else np.asarray(feeds[name])
                if x.ndim == 0 or x.shape[-1] != K:
                    raise CalibError(f"{model_path}: activation '{name}' has shape {list(x.shape)}, its last "
                                     f"dimension is not K = {K} (--activations)")
                if x.dtype not in (np.float32, np.float16):
                    raise CalibError(f"{model_path}: activation '{name}' is {x.dtype}, float32 or float16 expected")
                X = x.reshape(-1, K)
                counted = None
                if a.mask_padding and flat_mask is not None and not flat_mask.all():
                    if X.shape[0] != flat_mask.size:
                        raise CalibError(f"{model_path}: activation '{name}' has {X.shape[0]} rows per batch, "
                                         f"the attention mask {flat_mask.size} tokens: --mask_padding 1 cannot "
                                         f"tell its padding rows")
                    counted = flat_mask
                if samplers:
                    samplers[i].update(X, name)   # raises CalibError: stays on this thread
                work.append((i, X, counted))
                del x, X
            stats.run(accs, work)
            del work
            log_batch(gi, len(groups), bi, batches.n_batches, t1, t2, time.time())
        tokens_total, tokens_unpadded = tt, tu
        del sess
        if layered is not None and gi == 0:
            layered.finish_next()
        for i in group:
            acc = accs.pop(i)
            # An inf/nan statistic makes every AWQ/clip loss non-finite: the search could only guess.
            if acc.nonfinite or (acc.gram is not None and not np.isfinite(acc.gram).all()) or \
                    (a.gram_block > 0 and not np.isfinite(acc.gblocks).all()):
                raise CalibError(f"{model_path}: activation '{acc.name}' takes non-finite values (inf/nan) on "
                                 f"the calibration data, so its statistics cannot guide the search (check the "
                                 f"inputs; an fp16 model may overflow: use rtn_dq, or calibrate an fp32 export)")
            files = {"mean_abs_np": f"a{i}.mean_abs_np.f32", "sum_abs": f"a{i}.sum_abs.f64",
                     "gram": f"a{i}.gram.f64"}
            try:
                _write(os.path.join(out_dir, files["mean_abs_np"]), acc.mean_abs_np(), "<f4")
                _write(os.path.join(out_dir, files["sum_abs"]), acc.sum_abs, "<f8")
                if a.gram_block > 0:
                    files["gram"] = f"a{i}.gram_blocks.f64"
                    _write(os.path.join(out_dir, files["gram"]), acc.gblocks, "<f8")
                else:
                    _write(os.path.join(out_dir, files["gram"]), acc.gram_f64(), "<f8")
            except OSError as e:
                raise CalibError(f"--out {a.out}: cannot write ({e.strerror or e})") from None
            entries[i] = {"name": acc.name, "K": acc.K, "rows": acc.rows, "rows_all": acc.rows_all, **files}
            if a.gram_block > 0:
                entries[i]["gram_block"] = a.gram_block
            if samplers:
                smp = samplers.pop(i)
                rows = smp.rows(acc.K)
                f = f"a{i}.token_sample.f32"
                try:
                    _write(os.path.join(out_dir, f), rows, "<f4")
                except OSError as e:
                    raise CalibError(f"--out {a.out}: cannot write ({e.strerror or e})") from None
                entries[i].update({"token_sample": f, "token_sample_rows": int(rows.shape[0]),
                                   "token_sample_step": smp.step, "token_sample_dtype": smp.dtype})
            del acc

    stats.close()
    _test_kill_point("calib_capture_written")
    index = {"version": INDEX_VERSION, "samples": batches.samples, "seq_len": batches.seq_len,
             "batch_size": batches.batch_size, "provider": provider_used or providers[0][0],
             "mask_padding": bool(a.mask_padding), "tokens_total": tokens_total,
             "tokens_unpadded": tokens_unpadded, "passes": len(groups), "source": batches.source,
             "stats": "session" if in_session else "numpy",
             "activations": entries}
    try:
        tmp = os.path.join(out_dir, "index.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1)
        os.replace(tmp, os.path.join(out_dir, "index.json"))
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot write index.json ({e.strerror or e})") from None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"done: {len(acts)} activations, {tokens_total} tokens, {len(groups)} pass(es), "
        f"{time.time() - t0:.1f} s, peak RSS {rss:.0f} MiB")
    return 0


# --------------------------------------------------------------------------------------------
# grid
# --------------------------------------------------------------------------------------------

def get_scale(x_max, w_max, alpha):
    """ModelOpt 0.47 int4.py get_scale, verbatim: x_max / w_max numpy arrays (float32 for fp32 models,
    float16 for fp16 ones), alpha a Python float (AWQLiteHelper's k.item())."""
    scales = (x_max.__pow__(alpha) / (w_max.__pow__(1 - alpha) + np.finfo(w_max.dtype).tiny)).clip(
        min=1e-4, max=1e4
    )
    scales = scales / np.sqrt(scales.max() * scales.min())
    return scales


def get_scale_per_subgraph(x_m, w_m, alpha):
    """ModelOpt 0.47 run_awq_scale_search_per_subgraph's formula, verbatim: alpha is an np.float64 of
    np.arange there, so under NumPy 2 the scale is float64 (cast to float32 by the caller)."""
    alpha = np.float64(alpha)
    awq_scale = (x_m.__pow__(alpha) / (w_m.__pow__(1 - alpha) + 1e-4)).clip(min=1e-4)
    awq_scale = awq_scale / np.sqrt(awq_scale.max() * awq_scale.min())
    awq_scale[np.isinf(awq_scale)] = 1
    awq_scale[np.isnan(awq_scale)] = 1
    return awq_scale


_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_GRID_DTYPES = {"float32": (np.float32, "f32"), "float16": (np.float16, "f16")}


def grid(a) -> int:
    req_path = a.request
    if not os.path.isfile(req_path):
        raise CalibError(f"--request {req_path}: file not found")
    try:
        with open(req_path, encoding="utf-8") as f:
            req = json.load(f)
    except (OSError, ValueError) as e:
        raise CalibError(f"--request {req_path}: not JSON ({first_line(e)})") from None
    if not isinstance(req, dict):
        raise CalibError(f"--request {req_path}: a JSON object expected")
    alphas = req.get("alphas")
    if not isinstance(alphas, list) or not alphas or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in alphas):
        raise CalibError(f"--request {req_path}: \"alphas\" must be a non-empty list of numbers")
    alphas = [float(x) for x in alphas]
    items = req.get("items")
    if not isinstance(items, list):
        raise CalibError(f"--request {req_path}: \"items\" must be a list")
    base = os.path.dirname(os.path.abspath(req_path))
    dtype_name = req.get("dtype", "float32")
    if dtype_name not in _GRID_DTYPES:
        raise CalibError(f"--request {req_path}: \"dtype\" must be float32 or float16")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot create the folder ({e.strerror or e})") from None
    formula = req.get("formula", "per_node")
    if formula not in ("per_node", "per_subgraph"):
        raise CalibError(f"--request {req_path}: \"formula\" must be per_node or per_subgraph")
    scale_fn = get_scale if formula == "per_node" else get_scale_per_subgraph
    np_dt, ext = _GRID_DTYPES[dtype_name]
    file_dt = np.dtype(np_dt).newbyteorder("<")
    for j, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("id"), str) or not _ID_RE.match(it["id"]) \
                or it["id"] in (".", "..") or not isinstance(it.get("K"), int) or it["K"] <= 0 \
                or not isinstance(it.get("x_mean"), str) or not isinstance(it.get("w_mean"), str):
            raise CalibError(f"--request {req_path}: item {j} needs \"id\" (letters, digits, _.-), "
                             f"\"x_mean\", \"w_mean\" (file names) and \"K\" (positive int)")
        K = it["K"]
        vec = {}
        for key in ("x_mean", "w_mean"):
            p = os.path.join(base, it[key])
            try:
                v = np.fromfile(p, dtype=file_dt)
            except OSError as e:
                raise CalibError(f"--request {req_path}: item '{it['id']}': cannot read {key} file {p} "
                                 f"({e.strerror or e})") from None
            if os.path.getsize(p) != K * file_dt.itemsize:
                raise CalibError(f"--request {req_path}: item '{it['id']}': {key} file {p} holds "
                                 f"{os.path.getsize(p)} bytes, {K} {dtype_name} values expected")
            vec[key] = v.astype(np_dt)    # native byte order, the dtype ModelOpt has
        with np.errstate(all="ignore"):
            rows = [scale_fn(vec["x_mean"], vec["w_mean"], alpha).astype(np_dt) for alpha in alphas]
        outp = os.path.join(a.out, f"{it['id']}.grid.{ext}")
        try:
            _write(outp, np.stack(rows), file_dt)
        except OSError as e:
            raise CalibError(f"--out {a.out}: cannot write {outp} ({e.strerror or e})") from None
    return 0


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


def _test_kill_point(point: str) -> None:
    """Fault injection for the tests (as nibble's own kill points): NIBBLE_TEST_KILL_AT=<point> kills nibble
    and this process here, the statistics written but not their index: a kill during a cache write."""
    if os.environ.get("NIBBLE_TEST_KILL_AT") == point:
        import signal
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


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
        raise CalibError("command line: a subcommand is needed: capture or grid")
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


if __name__ == "__main__":
    sys.exit(main())

"""`capture.py feeds`: the calibration batches' model inputs written as raw arrays, for nibble's layer
engine (forward/), which runs the graph itself. The same batches `capture` feeds ONNX Runtime (texts
tokenized, random ids, or an npz; the inputs a batch lacks synthesised), so both engines see the same data.

OUT/batches.json: {"samples", "seq_len", "batch_size", "source", "batches": [{"dir": "b0", "tokens": N}, ...]}
OUT/b<i>/index.json: [{"name", "dtype", "shape", "file"}, ...] (forward/forward_files.h), plus the token mask
("__token_mask__", int64 [batch, seq]: 1 for the tokens a masked statistic counts).
"""
from __future__ import annotations

import json
import os

import numpy as np

from capture_run import source_batches
from messages import CalibError, log
from model_feeds import FeedOptions, model_inputs
from model_graph import load_graph

DTYPES = {np.dtype(np.int64): "int64", np.dtype(np.int32): "int32", np.dtype(np.float32): "float32",
          np.dtype(np.float16): "float16"}
TOKEN_MASK = "__token_mask__"


def _write_batch(d: str, feeds: dict, mask) -> int:
    os.makedirs(d, exist_ok=True)
    index = []
    arrays = dict(feeds)
    if mask is None:  # every token counts: the [batch, seq] of input_ids, else of the first input of rank >= 2
        first = feeds.get("input_ids")
        if first is None:
            first = next((v for v in feeds.values() if np.ndim(v) >= 2), next(iter(feeds.values())))
        mask = np.ones(np.shape(first)[:2])
    arrays[TOKEN_MASK] = np.asarray(mask).astype(np.int64)
    for i, (name, arr) in enumerate(arrays.items()):
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in DTYPES:
            raise CalibError(f"model input '{name}' is {arr.dtype}; the layer engine reads int64, int32, "
                             f"float32 and float16 inputs")
        arr.tofile(os.path.join(d, f"f{i}.bin"))
        index.append({"name": name, "dtype": DTYPES[arr.dtype], "shape": list(arr.shape), "file": f"f{i}.bin"})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f)
    return int(arrays[TOKEN_MASK].sum())


def dump_feeds(a) -> int:
    if a.calib_data and a.random_calib:
        raise CalibError("--calib_data and --use_random_calib contradict each other (give one)")
    model = load_graph(a.model)
    specs = model_inputs(model)
    opts = FeedOptions(a.add_position_ids, a.no_position_ids, a.no_past_kv_inputs, a.use_buffer_share, a.use_fp32)
    batches = source_batches(a, model, a.model, specs, opts)
    os.makedirs(a.out, exist_ok=True)
    listing = []
    for bi, (feeds, mask) in enumerate(batches):
        listing.append({"dir": f"b{bi}", "tokens": _write_batch(os.path.join(a.out, f"b{bi}"), feeds, mask)})
    top = {"samples": batches.samples, "seq_len": batches.seq_len, "batch_size": batches.batch_size,
           "source": batches.source, "batches": listing}
    tmp = os.path.join(a.out, "batches.json.tmp")
    with open(tmp, "w") as f:
        json.dump(top, f)
    os.replace(tmp, os.path.join(a.out, "batches.json"))
    log(f"feeds: {len(listing)} batches of {batches.batch_size} from {batches.source}")
    return 0

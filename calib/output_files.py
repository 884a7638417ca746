"""How capture and grid write what they computed: raw little-endian binaries and capture's index.json,
each written to a temporary name and renamed into place."""
from __future__ import annotations

import json
import os

import numpy as np

from messages import CalibError


def write_array(path: str, arr: np.ndarray, dtype: str) -> None:
    tmp = path + ".tmp"
    np.ascontiguousarray(arr, dtype=dtype).tofile(tmp)
    os.replace(tmp, path)


def write_stats(out_dir: str, out_arg: str, i: int, acc, gram_block: int) -> dict:
    """Activation i's statistics from its Accumulator `acc`; its entry in index.json."""
    files = {"mean_abs_np": f"a{i}.mean_abs_np.f32", "sum_abs": f"a{i}.sum_abs.f64",
             "gram": f"a{i}.gram.f64"}
    try:
        write_array(os.path.join(out_dir, files["mean_abs_np"]), acc.mean_abs_np(), "<f4")
        write_array(os.path.join(out_dir, files["sum_abs"]), acc.sum_abs, "<f8")
        if gram_block > 0:
            files["gram"] = f"a{i}.gram_blocks.f64"
            write_array(os.path.join(out_dir, files["gram"]), acc.gblocks, "<f8")
        else:
            write_array(os.path.join(out_dir, files["gram"]), acc.gram_f64(), "<f8")
    except OSError as e:
        raise CalibError(f"--out {out_arg}: cannot write ({e.strerror or e})") from None
    entry = {"name": acc.name, "K": acc.K, "rows": acc.rows, "rows_all": acc.rows_all, **files}
    if gram_block > 0:
        entry["gram_block"] = gram_block
    return entry


def write_token_sample(out_dir: str, out_arg: str, i: int, smp, K: int) -> dict:
    """Activation i's token sample from its TokenSampler `smp`; what it adds to the index entry."""
    rows = smp.rows(K)
    f = f"a{i}.token_sample.f32"
    try:
        write_array(os.path.join(out_dir, f), rows, "<f4")
    except OSError as e:
        raise CalibError(f"--out {out_arg}: cannot write ({e.strerror or e})") from None
    return {"token_sample": f, "token_sample_rows": int(rows.shape[0]),
            "token_sample_step": smp.step, "token_sample_dtype": smp.dtype}


def write_index(out_dir: str, out_arg: str, index: dict) -> None:
    try:
        tmp = os.path.join(out_dir, "index.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1)
        os.replace(tmp, os.path.join(out_dir, "index.json"))
    except OSError as e:
        raise CalibError(f"--out {out_arg}: cannot write index.json ({e.strerror or e})") from None

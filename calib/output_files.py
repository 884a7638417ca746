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


def stat_files(i: int, gram_block: int) -> dict:
    """Activation i's files, by index.json key."""
    return {"mean_abs_np": f"a{i}.mean_abs_np.f32", "sum_abs": f"a{i}.sum_abs.f64",
            "gram": f"a{i}.gram_blocks.f64" if gram_block > 0 else f"a{i}.gram.f64"}


def write_sums(out_dir: str, out_arg: str, i: int, acc, gram_block: int) -> dict:
    """Activation i's mean_abs_np and sum_abs from `acc`; its entry in index.json (the Gram file named,
    written apart)."""
    files = stat_files(i, gram_block)
    try:
        write_array(os.path.join(out_dir, files["mean_abs_np"]), acc.mean_abs_np(), "<f4")
        write_array(os.path.join(out_dir, files["sum_abs"]), acc.sum_abs, "<f8")
    except OSError as e:
        raise CalibError(f"--out {out_arg}: cannot write ({e.strerror or e})") from None
    entry = {"name": acc.name, "K": acc.K, "rows": acc.rows, "rows_all": acc.rows_all, **files}
    if gram_block > 0:
        entry["gram_block"] = gram_block
    return entry


def write_stats(out_dir: str, out_arg: str, i: int, acc, gram_block: int) -> dict:
    """Activation i's statistics from its Accumulator `acc`; its entry in index.json."""
    entry = write_sums(out_dir, out_arg, i, acc, gram_block)
    path = os.path.join(out_dir, entry["gram"])
    try:
        if gram_block > 0:
            write_array(path, acc.gblocks, "<f8")
        else:   # row blocks, so that no float64 copy of the whole matrix is ever made
            with open(path + ".tmp", "wb") as f:
                for _, block in acc.gram_f64_rows():
                    block.astype("<f8", copy=False).tofile(f)
            os.replace(path + ".tmp", path)
    except OSError as e:
        raise CalibError(f"--out {out_arg}: cannot write ({e.strerror or e})") from None
    return entry


def write_gram_rows(out_dir: str, out_arg: str, fname: str, r0: int, rows: np.ndarray, last: bool) -> None:
    """Rows r0.. of a row-major Gram file (float64 [rows, K]), written into its temporary name at their
    offset; the file is renamed into place with its last rows."""
    path = os.path.join(out_dir, fname)
    tmp = path + ".tmp"
    try:
        with open(tmp, "r+b" if r0 > 0 else "wb") as f:
            f.seek(r0 * rows.shape[1] * 8)
            f.write(np.ascontiguousarray(rows, dtype="<f8").tobytes())
        if last:
            os.replace(tmp, path)
    except OSError as e:
        raise CalibError(f"--out {out_arg}: cannot write ({e.strerror or e})") from None


def read_gram_rows(out_dir: str, fname: str, K: int, r0: int) -> np.ndarray:
    """The first r0 rows of a Gram file being written (write_gram_rows), float64 [r0, K], mapped."""
    return np.memmap(os.path.join(out_dir, fname) + ".tmp", dtype="<f8", mode="r", shape=(r0, K))


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

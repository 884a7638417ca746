"""How capture and grid write what they computed: raw little-endian binaries, each written to a
temporary name and renamed into place."""
from __future__ import annotations

import os

import numpy as np


def write_array(path: str, arr: np.ndarray, dtype: str) -> None:
    tmp = path + ".tmp"
    np.ascontiguousarray(arr, dtype=dtype).tofile(tmp)
    os.replace(tmp, path)

#!/usr/bin/env python3
"""The machine's sgemm rate through the BLAS nibble links (found with ldd), at the product shapes the
layer engine runs: the yardstick its calibration rate (the report's summary.calibration_engine.gflops)
is compared with.

    python3 bench/sgemm_rate.py [NIBBLE_BINARY] [--shape M,K,N ...] [--seconds 3]

Default shapes: SmolLM2-135M's and Llama-2-7B's MLP products on 1024 rows (the engine joins batches up to
1024 tokens). Prints GFLOP/s per shape and the best, with the library path and OPENBLAS_CORETYPE."""
import argparse
import ctypes
import os
import re
import subprocess
import time

import numpy as np

ROW_MAJOR, NO_TRANS = 101, 111


def blas_of(binary: str) -> str:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        m = re.search(r"(\S*blas\S*)\s+=>\s+(\S+)", line)
        if m:
            return m.group(2)
    raise SystemExit(f"{binary} links no BLAS library (ldd)")


def rate(lib, M: int, K: int, N: int, seconds: float) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.zeros((M, N), np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    args = [ROW_MAJOR, NO_TRANS, NO_TRANS, M, N, K, ctypes.c_float(1.0), a.ctypes.data_as(ptr), K,
            b.ctypes.data_as(ptr), N, ctypes.c_float(0.0), c.ctypes.data_as(ptr), N]
    lib.cblas_sgemm(*args)  # warm: threads started, pages touched
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        lib.cblas_sgemm(*args)
        n += 1
    return 2.0 * M * K * N * n / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "build", "nibble"))
    ap.add_argument("--shape", action="append", help="M,K,N (repeatable)")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shape] if a.shape else \
        [(1024, 576, 1536), (1024, 1536, 576), (1024, 4096, 11008), (1024, 11008, 4096)]
    path = blas_of(a.binary)
    lib = ctypes.CDLL(path)
    print(f"BLAS {path}, OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}")
    best = 0.0
    for M, K, N in shapes:
        r = rate(lib, M, K, N, a.seconds)
        best = max(best, r)
        print(f"sgemm {M}x{K}x{N}: {r:.1f} GFLOP/s")
    print(f"best: {best:.1f} GFLOP/s")


if __name__ == "__main__":
    main()

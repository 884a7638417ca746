#!/usr/bin/env python3
"""The machine's sgemm rate through the BLAS nibble links (found with ldd), at the product shapes the
layer engine runs: the yardstick its calibration rate (the report's summary.calibration_engine.gflops)
is compared with.

    python3 bench/sgemm_rate.py [NIBBLE_BINARY] [--shape M,K,N ...] [--seconds 3] [--panels ROWS,... --threads T]

Default shapes: SmolLM2-135M's and Llama-2-7B's MLP products on 1024 rows (the engine joins batches up to
1024 tokens). Prints GFLOP/s per shape and the best, with the library path and OPENBLAS_CORETYPE.
With --panels, OpenBLAS runs on one thread and each product is cut into row panels of each given height,
T threads taking them in turn: how the layer engine runs its products (forward/matmul.h), beside the
whole product on OpenBLAS's own threads."""
import argparse
import ctypes
import os
import re
import subprocess
import threading
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


def rate(lib, M: int, K: int, N: int, seconds: float, panel_rows: int = 0, threads: int = 1) -> float:
    """GFLOP/s of C = A·B; with panel_rows, as row panels taken in turn by `threads` threads."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.zeros((M, N), np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)

    def product(m0: int, rows: int) -> None:
        lib.cblas_sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, N, K, ctypes.c_float(1.0),
                        ctypes.cast(a.ctypes.data + 4 * m0 * K, ptr), K, b.ctypes.data_as(ptr), N,
                        ctypes.c_float(0.0), ctypes.cast(c.ctypes.data + 4 * m0 * N, ptr), N)

    def once() -> None:
        if not panel_rows:
            return product(0, M)
        panels = iter(range(0, M, panel_rows))
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    m0 = next(panels, None)
                if m0 is None:
                    return
                product(m0, min(panel_rows, M - m0))
        pool = [threading.Thread(target=worker) for _ in range(threads - 1)]
        for t in pool:
            t.start()
        worker()
        for t in pool:
            t.join()

    once()  # warm: threads started, pages touched
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        once()
        n += 1
    return 2.0 * M * K * N * n / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "build", "nibble"))
    ap.add_argument("--shape", action="append", help="M,K,N (repeatable)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--panels", help="ROWS,... : row panels on one-threaded OpenBLAS, beside the whole product")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads taking the panels")
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
    if a.panels:
        lib.openblas_set_num_threads(1)
        for M, K, N in shapes:
            for rows in (int(x) for x in a.panels.split(",")):
                r = rate(lib, M, K, N, a.seconds, rows, a.threads)
                print(f"sgemm {M}x{K}x{N} in {rows}-row panels on {a.threads} threads: {r:.1f} GFLOP/s")


if __name__ == "__main__":
    main()

"""Folds each calibration batch into the activations' Accumulators with numpy on the host, side by
side on threads (the statistics computed in the session are session_pass.py's)."""
from __future__ import annotations

import os

import numpy as np

from accumulator import Accumulator


class StatsRunner:
    """Folds one batch into every activation's Accumulator, activations side by side on `threads`
    threads, each BLAS call single-threaded.  Most of a batch's statistics are many small ssyrk calls
    (K = 576 on SmolLM2), where one thread per activation is about twice as fast as two threads inside
    each call.  Every accumulator is touched by one thread at a time and adds its rows in the same
    order, so the statistics do not depend on the thread count."""

    def __init__(self, threads: int):
        self.threads = max(1, threads or len(os.sched_getaffinity(0)) or 1)
        self.pool = None   # numpy's BLAS is single-threaded (OPENBLAS_NUM_THREADS, set by capture.py)
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

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

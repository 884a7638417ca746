"""Folds each calibration batch into the activations' Accumulators: with numpy on the host, side by
side on threads, or from the statistics the session computed (session_stats.py)."""
from __future__ import annotations

import os

import numpy as np

from accumulator import Accumulator
from messages import CalibError, first_line


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

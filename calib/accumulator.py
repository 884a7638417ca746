"""The statistics of one activation over the calibration set, computed with numpy (Accumulator:
mean_abs_np, sum_abs, the Gram matrix or its diagonal blocks)."""
from __future__ import annotations

import os

import numpy as np



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

    def gram_f64_rows(self, rows: int = 512):
        """The finished Gram matrix (float64, symmetric) as (r0, block) row blocks of at most `rows` rows,
        each mirrored from the upper triangle ssyrk filled: the values of gram_f64() without its whole
        float64 copy or the K² index arrays of a full mirror (K = 11008: 0.97 GB and 2 x 0.48 GB). Frees the
        float32 state at the end."""
        self._flush()
        G, K = self.gram, self.K
        for r0 in range(0, K, rows):
            r1 = min(K, r0 + rows)
            block = np.empty((r1 - r0, K), np.float64)
            block[:, r0:] = G[r0:r1, r0:]
            if SYRK.fn is not None:   # only the upper triangle is set: the rest from its transpose
                block[:, :r0] = G[:r0, r0:r1].T
                sq = block[:, r0:r1]
                il = np.tril_indices(r1 - r0, -1)
                sq[il] = sq.T[il]
            else:
                block[:, :r0] = G[r0:r1, :r0]
            yield r0, block
        self.gram = self.buf = None

    def gram_f64(self) -> np.ndarray:
        """The finished Gram matrix (float64, symmetric); frees the float32 state."""
        self._flush()
        g = SYRK.full(self.gram).astype(np.float64)
        self.gram = self.buf = None
        return g

    def mean_abs_np(self) -> np.ndarray:
        if self.K == 1:
            col = np.concatenate(self.col1).reshape(-1, 1) if self.col1 else np.zeros((0, 1), np.float32)
            return col.mean(0).astype(np.float32)
        out = np.empty(self.K, np.float32)
        np.true_divide(self.acc32, np.intp(self.rows_all), out=out, casting="unsafe")
        return out

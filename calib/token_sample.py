"""ModelOpt's awq_clip token sample of one activation (--sample_tokens)."""
from __future__ import annotations

import numpy as np

from messages import CalibError


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

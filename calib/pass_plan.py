"""The activations split into passes over the calibration set, each within --budget_mb.

numpy path: a pass holds its activations' accumulators (accumulator.py), so a pass is sized by them.
Statistics in the session (session_stats.py): a pass is sized by the bytes the session returns per
batch, which is also what its accumulators hold (they are the float32 sums of those outputs): the
diagonal blocks for awq_clip (--gram_block), else the Gram matrix, cut into row panels over several
passes when one activation's alone would exceed the budget.
"""
from __future__ import annotations

from dataclasses import dataclass

from messages import warn

F32 = 4


@dataclass(frozen=True)
class Part:
    """Rows r0..r1-1 of activation i's Gram statistic (0..K: all of it; with --gram_block always all
    of its diagonal blocks). The first part (head) also carries the activation's |x| sums and, in
    modelopt mode, its token sample."""
    i: int
    K: int
    r0: int
    r1: int

    @property
    def head(self) -> bool:
        return self.r0 == 0

    @property
    def last(self) -> bool:
        return self.r1 == self.K


def numpy_bytes(K: int, gram_block: int) -> int:
    """The accumulators of one activation on the numpy path."""
    if gram_block > 0:
        return -(-K // gram_block) * gram_block * gram_block * F32
    from accumulator import Accumulator
    return K * K * F32 + Accumulator.GRAM_ROWS * K * F32     # float32 Gram + its row buffer


def head_bytes(K: int, sample_rows: int) -> int:
    """The head part's outputs besides the Gram: two float32 sums, the int64 shape, and the activation's
    rows (sample_rows per batch, float32 at most) when the token sample needs them."""
    return 2 * K * F32 + 2 * 8 + sample_rows * K * F32


def session_bytes(p: Part, gram_block: int, sample_rows: int) -> int:
    """The bytes the session returns per batch for part p."""
    if gram_block > 0:
        g = -(-p.K // gram_block) * gram_block * gram_block * F32
    else:
        g = (p.r1 - p.r0) * (p.K - p.r0) * F32
    return g + (head_bytes(p.K, sample_rows) if p.head else 0)


def row_panels(i: int, K: int, budget: float, sample_rows: int) -> list[Part]:
    """Activation i's Gram cut into row panels, each as many rows as fit the budget (later panels are
    narrower, K - r0 columns, so they take more rows); one row at least."""
    parts, r0 = [], 0
    while r0 < K:
        avail = budget - (head_bytes(K, sample_rows) if r0 == 0 else 0)
        rows = max(1, min(K - r0, int(avail // ((K - r0) * F32))))
        parts.append(Part(i, K, r0, r0 + rows))
        r0 += rows
    return parts


def plan_passes(acts: list[tuple[str, int]], budget: float, gram_block: int, in_session: bool,
                sample_rows: int = 0) -> list[list[Part]]:
    """The passes in order, each a list of Parts whose bytes (numpy_bytes or session_bytes) add up to at
    most `budget` where one part alone does not exceed it (then it has a pass of its own, with a warning).
    An activation's panels stay in row order, so a panel's earlier rows are written before it."""
    parts: list[Part] = []
    for i, (_, K) in enumerate(acts):
        whole = Part(i, K, 0, K)
        if in_session and gram_block <= 0 and session_bytes(whole, 0, sample_rows) > budget:
            parts += row_panels(i, K, budget, sample_rows)
        else:
            parts.append(whole)
    groups: list[list[Part]] = []
    cur, size = [], 0
    for p in parts:
        b = session_bytes(p, gram_block, sample_rows) if in_session else numpy_bytes(p.K, gram_block)
        if cur and size + b > budget:
            groups.append(cur)
            cur, size = [], 0
        if b > budget:
            what = "its session outputs per batch" if in_session else "its Gram matrix alone"
            warn(f"activation '{acts[p.i][0]}': {what} ({b / 2**20:.3f} MiB) exceeds --budget_mb")
        cur.append(p)
        size += b
    if cur:
        groups.append(cur)
    return groups


def planned_bytes(group: list[Part], gram_block: int, sample_rows: int, fetched: set[int]) -> int:
    """The bytes the session returns per batch for the parts of `group` it computes (fetched: the
    activations the session computes; a graph input's statistics are computed with numpy)."""
    return sum(session_bytes(p, gram_block, sample_rows) for p in group if p.i in fetched)

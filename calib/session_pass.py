"""One pass over the calibration set with the statistics computed in the session (session_stats.py):
each batch's session outputs summed into one PartAccumulator per pass_plan.Part, then written."""
from __future__ import annotations

import time

import numpy as np

from messages import CalibError, first_line, log, log_batch
from model_feeds import count_tokens
from output_files import read_gram_rows, stat_files, write_gram_rows, write_sums, write_token_sample
from pass_plan import planned_bytes
from session_stats import COUNTED, HEAD_SUFFIXES, counted_column, gram_output, numpy_outputs, part_outputs
from token_sample import TokenSampler


class PartAccumulator:
    """The float32 sum over the batches of one part's Gram output (whole, a row panel or the diagonal
    blocks), and for the head part the |x| sums: sum_abs in float64, mean_abs_np = the float32 sum of
    every row / rows_all (numpy's true_divide by the intp row count)."""

    def __init__(self, name: str, part, gram_block: int):
        self.name, self.K, self.part, self.gram_block = name, part.K, part, gram_block
        K, B = part.K, gram_block
        shape = (-(-K // B), B, B) if B > 0 else (part.r1 - part.r0, K - part.r0)
        self.gram = np.zeros(shape, np.float32)
        self.acc32 = np.zeros(K, np.float32) if part.head else None
        self.sum_abs = np.zeros(K, np.float64) if part.head else None
        self.rows = self.rows_all = self.nonfinite = 0

    def update(self, gram: np.ndarray, sums=None) -> None:
        """gram: this part's output of one batch; sums (head only): (sum_counted, sum_all, rows_all, rows)."""
        self.gram += gram
        if sums is None:
            return
        s_cnt, s_all, rows_all, rows = sums
        self.acc32 = self.acc32 + s_all.astype(np.float32)
        self.sum_abs += s_cnt.astype(np.float64)
        if not np.isfinite(self.sum_abs).all():
            self.nonfinite += 1
        self.rows_all += rows_all
        self.rows += rows

    def finite(self) -> bool:
        return not self.nonfinite and bool(np.isfinite(self.gram).all())

    def mean_abs_np(self) -> np.ndarray:
        out = np.empty(self.K, np.float32)
        np.true_divide(self.acc32, np.intp(self.rows_all), out=out, casting="unsafe")
        return out

    def gram_f64(self, earlier=None) -> np.ndarray:
        """What the Gram file holds of this part, float64 and symmetric: the diagonal blocks (the upper
        triangle of each mirrored), or rows r0..r1 of XᵀX (the computed columns r0.. with their diagonal
        block mirrored, columns ..r0 the transpose of the earlier panels' columns r0..r1)."""
        g = self.gram.astype(np.float64)
        if self.gram_block > 0:
            lo = np.tril_indices(self.gram_block, -1)
            g[:, lo[0], lo[1]] = g[:, lo[1], lo[0]]
            return g
        r0, r1, K = self.part.r0, self.part.r1, self.K
        rows = np.empty((r1 - r0, K), np.float64)
        rows[:, r0:] = g
        d = rows[:, r0:r1]
        lo = np.tril_indices(r1 - r0, -1)
        d[lo] = d.T[lo]
        if r0:
            rows[:, :r0] = np.asarray(earlier[:, r0:r1]).T
        return rows


def _run_session(sess, outs: list[str], feeds: dict, counted, model_path: str, bi: int) -> dict:
    if sess is None:
        return {}
    try:
        return dict(zip(outs, sess.run(outs, {**feeds, COUNTED: counted_column(counted)})))
    except Exception as e:  # noqa: BLE001
        raise CalibError(f"{model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                         f"({first_line(e)})") from None


def _check_rows(name: str, K: int, shape, counted, model_path: str) -> int:
    R, k = int(shape[0]), int(shape[-1])
    if k != K:
        raise CalibError(f"{model_path}: activation '{name}' has last dimension {k}, not K = {K} (--activations)")
    if counted is not None and counted.size != R:
        raise CalibError(f"{model_path}: activation '{name}' has {R} rows per batch, the attention mask "
                         f"{counted.size} tokens: --mask_padding 1 cannot tell its padding rows")
    return R


class SessionPass:
    """Pass gi over the calibration set for the parts of `group`, on CapturePasses `cp`'s model,
    batches and options."""

    def __init__(self, cp, gi: int, group: list):
        self.cp, self.gi, self.group = cp, gi, group
        a = cp.a
        self.gram_block, self.keep_rows = a.gram_block, a.sample_tokens > 0
        heads = [p.i for p in group if p.head]
        self.samplers = {i: TokenSampler(a.sample_tokens, cp.batches.n_batches) for i in heads} \
            if self.keep_rows else {}
        self.accs = {p: PartAccumulator(cp.acts[p.i][0], p, a.gram_block) for p in group}
        self.fetched = {p.i for p in group if cp.acts[p.i][0] not in cp.graph_inputs}
        self.most = 0     # the most bytes the session returned for one batch

    def _session(self):
        from model_graph import augmented_model_bytes, session_model_bytes
        cp, acts = self.cp, self.cp.acts
        order = sorted(self.fetched)
        if not order:
            return None, []
        items = [(acts[i][0], acts[i][1], [p for p in self.group if p.i == i]) for i in order]
        cut = augmented_model_bytes(cp.model, [n for n, _, _ in items])
        sess = cp._session(session_model_bytes(cut, items, self.gram_block, self.keep_rows))
        outs = [o for n, _, parts in items for p in parts for o in part_outputs(n, p, self.gram_block,
                                                                                    self.keep_rows)]
        return sess, outs

    def run(self) -> None:
        cp, a = self.cp, self.cp.a
        sess, outs = self._session()
        tt = tu = 0
        for bi, (feeds, tok_mask) in enumerate(cp.batches):
            t1 = time.time()
            flat_mask = None if tok_mask is None else (np.asarray(tok_mask) != 0).reshape(-1)
            counted = flat_mask if a.mask_padding and flat_mask is not None and not flat_mask.all() else None
            got = _run_session(sess, outs, feeds, counted, cp.model_path, bi)
            self.most = max(self.most, sum(v.nbytes for v in got.values()))
            t2 = time.time()
            self._fold(got, feeds, counted)
            log_batch(self.gi, cp.passes, bi, cp.batches.n_batches, t1, t2, time.time())
            tt, tu = count_tokens(tt, tu, tok_mask, flat_mask, feeds)
        del sess
        cp.tokens_total, cp.tokens_unpadded = tt, tu
        plan = planned_bytes(self.group, self.gram_block, cp.sample_rows, self.fetched)
        log(f"pass {self.gi + 1}/{cp.passes}: session outputs {self.most} bytes per batch at most "
            f"(planned {plan}, --budget_mb {int(a.budget_mb * 2**20)} bytes)")
        for p in self.group:
            self._write(p)

    def _fold(self, got: dict, feeds: dict, counted) -> None:
        """One batch's outputs (or, for a graph input, numpy's equivalents) into the accumulators."""
        cp, B = self.cp, self.gram_block
        for p in self.group:
            name, K = cp.acts[p.i]
            if p.i not in self.fetched:   # a graph input: the feed itself
                X = np.asarray(feeds[name])
                _check_rows(name, K, X.reshape(-1, X.shape[-1]).shape, counted, cp.model_path)
                got.update(numpy_outputs(name, X.reshape(-1, K), counted, [p], B, self.keep_rows))
            sums = None
            if p.head:
                s_cnt, s_all, shape = (got.pop(name + s) for s in HEAD_SUFFIXES)
                R = _check_rows(name, K, shape, counted, cp.model_path)
                sums = (s_cnt, s_all, R, R if counted is None else int(counted.sum()))
                if self.keep_rows:
                    self.samplers[p.i].update(got.pop(name).reshape(-1, K), name)
            with np.errstate(all="ignore"):
                self.accs[p].update(got.pop(gram_output(name, p.r0, B)), sums)

    def _write(self, p) -> None:
        cp, a = self.cp, self.cp.a
        acc = self.accs.pop(p)
        if not acc.finite():
            raise CalibError(f"{cp.model_path}: activation '{acc.name}' takes non-finite values (inf/nan) on "
                             f"the calibration data, so its statistics cannot guide the search (check the "
                             f"inputs; an fp16 model may overflow: use rtn_dq, or calibrate an fp32 export)")
        fname = stat_files(p.i, self.gram_block)["gram"]
        earlier = read_gram_rows(cp.out_dir, fname, p.K, p.r0) if p.r0 and self.gram_block <= 0 else None
        rows = acc.gram_f64(earlier)
        del earlier
        write_gram_rows(cp.out_dir, a.out, fname, p.r0, rows.reshape(-1, rows.shape[-1]), p.last or self.gram_block > 0)
        if p.head:
            cp.entries[p.i] = write_sums(cp.out_dir, a.out, p.i, acc, self.gram_block)
            if self.samplers:
                cp.entries[p.i].update(write_token_sample(cp.out_dir, a.out, p.i, self.samplers.pop(p.i), p.K))

"""The `capture` subcommand: the calibration set run through ONNX Runtime, ONE forward pass per batch
for all requested activations (one pass over the set per group of them when --budget_mb asks for
groups), their statistics written into --out with index.json."""
from __future__ import annotations

import os
import resource
import time

import numpy as np

from accumulator import Accumulator
from calib_inputs import NpzBatches, random_batches, text_batches
from layer_capture import layer_mode
from messages import CalibError, first_line, log, log_batch, warn
from model_feeds import FeedOptions, batch_rows, count_tokens, model_inputs
from model_graph import augmented_model_bytes, check_activations, load_graph, read_activations
from ort_session import make_session, release_large_blocks, select_providers
from output_files import write_index, write_stats, write_token_sample
from pass_plan import plan_passes
from session_pass import SessionPass
from stats_runner import StatsRunner
from token_sample import TokenSampler

INDEX_VERSION = 1


def kill_point(point: str) -> None:
    """Fault injection for the tests (as nibble's own kill points): NIBBLE_TEST_KILL_AT=<point> kills nibble
    and this process here, the statistics written but not their index: a kill during a cache write."""
    if os.environ.get("NIBBLE_TEST_KILL_AT") == point:
        import signal
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def check_sizes(a) -> None:
    """The options that are wrong whatever the files say."""
    if a.calib_size < 1 or a.seq_len < 1 or a.batch_size < 1:
        raise CalibError("--calib_size, --seq_len and --batch_size must be >= 1")
    if a.batch_size > a.calib_size:
        raise CalibError(f"--batch_size {a.batch_size} is larger than --calib_size {a.calib_size}")
    if not (a.budget_mb > 0):
        raise CalibError("--budget_mb must be > 0")
    if a.no_position_ids and a.add_position_ids:
        raise CalibError("--add_position_ids and --no_position_ids contradict each other")


def source_batches(a, model, model_path: str, specs, opts: FeedOptions):
    """The calibration data's batches: random token ids, an npz of ready inputs, or texts."""
    if a.random_calib:
        return random_batches(model, model_path, specs, opts, a.calib_size, a.seq_len, a.batch_size)
    if a.calib_data:
        return NpzBatches(a.calib_data, model_path, specs, opts, a.calib_size, a.batch_size)
    return text_batches(model_path, specs, opts, a.dataset, a.tokenizer, a.calib_size, a.seq_len,
                        a.batch_size)


def make_out_dir(a, out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot create the folder ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK):
        raise CalibError(f"--out {a.out}: folder not writable")


def stats_in_session(a, providers: list[tuple[str, dict]], layered) -> bool:
    # A GPU provider computes the statistics itself (session_stats.py); the CPU keeps numpy's exact order.
    in_session = a.stats_in_session == "on" or (a.stats_in_session == "auto" and
                                                providers[0][0] != "CPUExecutionProvider")
    if in_session and layered is not None:   # not combined yet: the segment's statistics go through numpy
        if a.stats_in_session == "on":
            warn("--stats_in_session on: no effect layer by layer (the statistics are computed with numpy)")
        in_session = False
    return in_session



def _finite(x: np.ndarray, rows: int = 1024) -> bool:
    """np.isfinite(x).all() a block of rows at a time: no mask as large as a K x K Gram matrix."""
    return all(np.isfinite(x[r:r + rows]).all() for r in range(0, x.shape[0], rows))

class CapturePasses:
    """The passes of one capture over the calibration set, one per group of activations: the group's
    session, every batch folded into the group's accumulators, then their statistics written to
    --out (entries: index.json's "activations")."""

    def __init__(self, a, model, model_dir: str, out_dir: str, acts: list[tuple[str, int]], batches, layered,
                 providers: list[tuple[str, dict]], in_session: bool, stats: StatsRunner, passes: int):
        self.a, self.model, self.model_path, self.model_dir, self.out_dir = a, model, a.model, model_dir, out_dir
        self.acts, self.batches, self.layered = acts, batches, layered
        self.providers, self.in_session, self.stats, self.passes = providers, in_session, stats, passes
        self.graph_inputs = {vi.name for vi in model.graph.input}
        self.entries: list[dict | None] = [None] * len(acts)
        self.provider_used = None
        self.tokens_total = self.tokens_unpadded = 0
        self.sample_rows = 0   # statistics in the session: the token rows of a batch (pass_plan.head_bytes)

    def run(self, gi: int, group: list) -> None:
        """Pass gi, over the pass_plan.Parts of `group`."""
        if self.in_session:
            SessionPass(self, gi, group).run()
            return
        a, acts = self.a, self.acts
        ids = [p.i for p in group]      # the numpy path's parts are whole activations
        samplers = {i: TokenSampler(a.sample_tokens, self.batches.n_batches) for i in ids} \
            if a.sample_tokens > 0 else {}
        fetch, sess = self._graph(gi, ids)
        accs = {i: Accumulator(acts[i][0], acts[i][1], gram_block=a.gram_block) for i in ids}
        self.tokens_total, self.tokens_unpadded = self._fold_batches(gi, ids, fetch, sess, accs, samplers)
        del sess
        if self.layered is not None and gi == 0:
            self.layered.finish_next()
        for i in ids:
            self._write(i, accs.pop(i), samplers)

    def _session(self, model_bytes: bytes):
        sess = make_session(model_bytes, self.model_dir, self.providers, self.model_path)
        self.provider_used = self.provider_used or sess.get_providers()[0]
        return sess

    def _graph(self, gi: int, group: list[int]):
        """(the tensors the session fetches, the session): none when the group reads only graph inputs,
        none yet layer by layer (the segment's session is made at the first batch)."""
        names = [self.acts[i][0] for i in group]
        fetch = [n for n in names if n not in self.graph_inputs]
        sess = None
        if self.layered is not None:
            fetch = self.layered.fetch(names, carry=gi == 0)
        elif fetch:
            sess = self._session(augmented_model_bytes(self.model, fetch))
        return fetch, sess

    def _fold_batches(self, gi: int, group: list[int], fetch: list[str], sess, accs: dict,
                      samplers: dict) -> tuple[int, int]:
        """Every batch run and folded into accs; (tokens, unpadded tokens)."""
        layered, batches = self.layered, self.batches
        tt = tu = 0
        for bi, (feeds, tok_mask) in enumerate(batches):
            t1 = time.time()
            if layered is not None and sess is None and fetch:
                sess = self._session(layered.model_bytes(fetch))
            flat_mask = None if tok_mask is None else (np.asarray(tok_mask) != 0).reshape(-1)
            got = self._run_batch(sess, fetch, feeds, bi)
            t2 = time.time()
            if layered is not None and gi == 0:
                layered.save_next(bi, feeds, tok_mask, got)
            if layered is not None and tok_mask is None:   # the boundary carries the token count
                tt, tu = tt + layered.tokens, tu + layered.tokens
            else:
                tt, tu = count_tokens(tt, tu, tok_mask, flat_mask, feeds)
            work = self._work(group, got, feeds, flat_mask, samplers)
            self.stats.run(accs, work)
            del work
            log_batch(gi, self.passes, bi, batches.n_batches, t1, t2, time.time())
        return tt, tu

    def _run_batch(self, sess, fetch: list[str], feeds: dict, bi: int) -> dict:
        """The fetched activations of one batch, by name ({} without a session)."""
        if sess is None:
            return {}
        try:
            vals = sess.run(fetch, feeds if self.layered is None else self.layered.inputs(feeds))
        except Exception as e:  # noqa: BLE001
            raise CalibError(f"{self.model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                             f"({first_line(e)})") from None
        got = dict(zip(fetch, vals))
        del vals
        return got

    def _work(self, group: list[int], got: dict, feeds: dict, flat_mask, samplers: dict) -> list:
        """[(i, X [rows, K], counted rows or None)] of one batch for StatsRunner, each activation checked."""
        a, model_path = self.a, self.model_path
        work = []
        for i in group:
            name, K = self.acts[i]
            x = got.pop(name) if name in got else np.asarray(feeds[name])
            if x.ndim == 0 or x.shape[-1] != K:
                raise CalibError(f"{model_path}: activation '{name}' has shape {list(x.shape)}, its last "
                                 f"dimension is not K = {K} (--activations)")
            if x.dtype not in (np.float32, np.float16):
                raise CalibError(f"{model_path}: activation '{name}' is {x.dtype}, float32 or float16 expected")
            X = x.reshape(-1, K)
            counted = None
            if a.mask_padding and flat_mask is not None and not flat_mask.all():
                if X.shape[0] != flat_mask.size:
                    raise CalibError(f"{model_path}: activation '{name}' has {X.shape[0]} rows per batch, "
                                     f"the attention mask {flat_mask.size} tokens: --mask_padding 1 cannot "
                                     f"tell its padding rows")
                counted = flat_mask
            if samplers:
                samplers[i].update(X, name)   # raises CalibError: stays on this thread
            work.append((i, X, counted))
            del x, X
        return work

    def _write(self, i: int, acc: Accumulator, samplers: dict) -> None:
        """Activation i's statistics (and token sample) written, its index entry kept."""
        a = self.a
        # An inf/nan statistic makes every AWQ/clip loss non-finite: the search could only guess.
        if acc.nonfinite or (acc.gram is not None and not _finite(acc.gram)) or \
                (a.gram_block > 0 and not _finite(acc.gblocks)):
            raise CalibError(f"{self.model_path}: activation '{acc.name}' takes non-finite values (inf/nan) on "
                             f"the calibration data, so its statistics cannot guide the search (check the "
                             f"inputs; an fp16 model may overflow: use rtn_dq, or calibrate an fp32 export)")
        self.entries[i] = write_stats(self.out_dir, a.out, i, acc, a.gram_block)
        if samplers:
            self.entries[i].update(write_token_sample(self.out_dir, a.out, i, samplers.pop(i), acc.K))


def capture(a) -> int:
    t0 = time.time()
    check_sizes(a)
    model_path = a.model
    model_dir = os.path.dirname(os.path.abspath(model_path))
    out_dir = os.path.abspath(a.out)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CalibError(f"--out {a.out}: exists and is not a folder")
    acts = read_activations(a.activations)
    model = load_graph(model_path)
    if os.path.realpath(out_dir) == os.path.realpath(model_dir):
        raise CalibError(f"--out {a.out}: is the model's folder; calibration never writes next to the model")
    check_activations(model, acts, model_path)
    specs = model_inputs(model)
    opts = FeedOptions(a.add_position_ids, a.no_position_ids, a.no_past_kv_inputs, a.use_buffer_share, a.use_fp32)

    if a.calib_data and a.random_calib:
        raise CalibError("--calib_data and --use_random_calib contradict each other (give one)")

    def source():
        return source_batches(a, model, model_path, specs, opts)
    layered = layer_mode(a, model, acts)
    batches = layered if layered is not None else source()
    if layered is not None:
        layered.open(source)
    if layered is not None and a.layer_advance:
        if layered.advance(model_dir, select_providers(a.eps), model_path):
            log(f"layer group {a.layer}: boundary for the next group written, {time.time() - t0:.1f} s")
        return 0
    providers = select_providers(a.eps)
    make_out_dir(a, out_dir)

    if a.gram_block < 0:
        raise CalibError("--gram_block must be >= 0")
    in_session = stats_in_session(a, providers, layered)
    # the token sample's session outputs: the activation's rows, one per token
    sample_rows = batch_rows(batches) if in_session and a.sample_tokens > 0 else 0
    groups = plan_passes(acts, a.budget_mb * 2**20, a.gram_block, in_session, sample_rows)
    stats = StatsRunner(a.threads)
    release_large_blocks()
    log(f"{len(acts)} activations, {batches.samples} samples in {batches.n_batches} batches of "
        f"{batches.batch_size} from {batches.source}, {len(groups)} pass(es), providers "
        f"{','.join(p for p, _ in providers)}")

    passes = CapturePasses(a, model, model_dir, out_dir, acts, batches, layered, providers, in_session, stats,
                           len(groups))
    passes.sample_rows = sample_rows
    for gi, group in enumerate(groups):
        passes.run(gi, group)

    stats.close()
    kill_point("calib_capture_written")
    index = {"version": INDEX_VERSION, "samples": batches.samples, "seq_len": batches.seq_len,
             "batch_size": batches.batch_size, "provider": passes.provider_used or providers[0][0],
             "mask_padding": bool(a.mask_padding), "tokens_total": passes.tokens_total,
             "tokens_unpadded": passes.tokens_unpadded, "passes": len(groups), "source": batches.source,
             "stats": "session" if in_session else "numpy",
             "activations": passes.entries}
    write_index(out_dir, a.out, index)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"done: {len(acts)} activations, {passes.tokens_total} tokens, {len(groups)} pass(es), "
        f"{time.time() - t0:.1f} s, peak RSS {rss:.0f} MiB")
    return 0

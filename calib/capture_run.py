"""The `capture` subcommand: the calibration set run through ONNX Runtime, ONE forward pass per batch
for all requested activations (one pass over the set per group of them when --budget_mb asks for
groups), their statistics written into --out with index.json."""
from __future__ import annotations

import json
import os
import resource
import time

import numpy as np

from accumulator import Accumulator, group_by_budget
from calib_inputs import NpzBatches, random_batches, text_batches
from layer_capture import layer_mode
from messages import CalibError, first_line, log, warn
from model_feeds import FeedOptions, model_inputs
from model_graph import augmented_model_bytes, check_activations, load_graph, read_activations, session_model_bytes
from ort_session import make_session, release_large_blocks, select_providers
from output_files import write_array
from stats_runner import StatsRunner
from token_sample import TokenSampler

INDEX_VERSION = 1


def count_tokens(tt: int, tu: int, tok_mask, flat_mask, feeds) -> tuple[int, int]:
    """Tokens so far (all, unpadded) after one more batch."""
    if tok_mask is not None:
        return tt + tok_mask.size, tu + int(flat_mask.sum())
    if "input_ids" in feeds:
        return tt + feeds["input_ids"].size, tu + feeds["input_ids"].size
    return tt, tu


def log_batch(gi: int, passes: int, bi: int, n_batches: int, t1: float, t2: float, t3: float) -> None:
    log(f"pass {gi + 1}/{passes} batch {bi + 1}/{n_batches}: run {t2 - t1:.2f} s, stats {t3 - t2:.2f} s")


def kill_point(point: str) -> None:
    """Fault injection for the tests (as nibble's own kill points): NIBBLE_TEST_KILL_AT=<point> kills nibble
    and this process here, the statistics written but not their index: a kill during a cache write."""
    if os.environ.get("NIBBLE_TEST_KILL_AT") == point:
        import signal
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def capture(a) -> int:
    t0 = time.time()
    if a.calib_size < 1 or a.seq_len < 1 or a.batch_size < 1:
        raise CalibError("--calib_size, --seq_len and --batch_size must be >= 1")
    if a.batch_size > a.calib_size:
        raise CalibError(f"--batch_size {a.batch_size} is larger than --calib_size {a.calib_size}")
    if not (a.budget_mb > 0):
        raise CalibError("--budget_mb must be > 0")
    if a.no_position_ids and a.add_position_ids:
        raise CalibError("--add_position_ids and --no_position_ids contradict each other")
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

    def source_batches():
        if a.random_calib:
            return random_batches(model, model_path, specs, opts, a.calib_size, a.seq_len, a.batch_size)
        if a.calib_data:
            return NpzBatches(a.calib_data, model_path, specs, opts, a.calib_size, a.batch_size)
        return text_batches(model_path, specs, opts, a.dataset, a.tokenizer, a.calib_size, a.seq_len,
                            a.batch_size)
    layered = layer_mode(a, model, acts)
    batches = layered if layered is not None else source_batches()
    if layered is not None:
        layered.open(source_batches)
    if layered is not None and a.layer_advance:
        if layered.advance(model_dir, select_providers(a.eps), model_path):
            log(f"layer group {a.layer}: boundary for the next group written, {time.time() - t0:.1f} s")
        return 0
    providers = select_providers(a.eps)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot create the folder ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK):
        raise CalibError(f"--out {a.out}: folder not writable")

    if a.gram_block < 0:
        raise CalibError("--gram_block must be >= 0")
    groups = group_by_budget(acts, a.budget_mb * 2**20, a.gram_block)
    # A GPU provider computes the statistics itself (session_stats.py); the CPU keeps numpy's exact order.
    in_session = a.stats_in_session == "on" or (a.stats_in_session == "auto" and
                                                providers[0][0] != "CPUExecutionProvider")
    if in_session and layered is not None:   # not combined yet: the segment's statistics go through numpy
        if a.stats_in_session == "on":
            warn("--stats_in_session on: no effect layer by layer (the statistics are computed with numpy)")
        in_session = False
    stats = StatsRunner(a.threads)
    release_large_blocks()
    graph_inputs = {vi.name for vi in model.graph.input}
    log(f"{len(acts)} activations, {batches.samples} samples in {batches.n_batches} batches of "
        f"{batches.batch_size} from {batches.source}, {len(groups)} pass(es), providers "
        f"{','.join(p for p, _ in providers)}")

    entries: list[dict | None] = [None] * len(acts)
    provider_used = None
    tokens_total = tokens_unpadded = 0
    for gi, group in enumerate(groups):
        names = [acts[i][0] for i in group]
        fetch = [n for n in names if n not in graph_inputs]
        sess = None
        samplers = {i: TokenSampler(a.sample_tokens, batches.n_batches) for i in group} if a.sample_tokens > 0 else {}
        if layered is not None:
            fetch = layered.fetch(names, carry=gi == 0)
        elif fetch:
            cut = augmented_model_bytes(model, fetch)
            if in_session:
                cut = session_model_bytes(cut, [(n, K) for n, K in (acts[i] for i in group) if n in fetch],
                                          bool(samplers))
            sess = make_session(cut, model_dir, providers, model_path)
            provider_used = provider_used or sess.get_providers()[0]
        accs = {i: Accumulator(acts[i][0], acts[i][1], gram_block=a.gram_block) for i in group}
        tt = tu = 0
        for bi, (feeds, tok_mask) in enumerate(batches):
            t1 = time.time()
            if layered is not None and sess is None and fetch:
                sess = make_session(layered.model_bytes(fetch), model_dir, providers, model_path)
                provider_used = provider_used or sess.get_providers()[0]
            flat_mask = None if tok_mask is None else (np.asarray(tok_mask) != 0).reshape(-1)
            if in_session:
                counted = flat_mask if a.mask_padding and flat_mask is not None and not flat_mask.all() else None
                stats.run_reduced(accs, group, acts, sess, fetch, feeds, counted, samplers, model_path, bi)
                log_batch(gi, len(groups), bi, batches.n_batches, t1, time.time(), time.time())
                tt, tu = count_tokens(tt, tu, tok_mask, flat_mask, feeds)
                continue
            if sess is not None:
                try:
                    vals = sess.run(fetch, feeds if layered is None else layered.inputs(feeds))
                except Exception as e:  # noqa: BLE001
                    raise CalibError(f"{model_path}: ONNX Runtime failed on calibration batch {bi + 1} "
                                     f"({first_line(e)})") from None
                got = dict(zip(fetch, vals))
                del vals
            else:
                got = {}
            t2 = time.time()
            if layered is not None and gi == 0:
                layered.save_next(bi, feeds, tok_mask, got)
            if layered is not None and tok_mask is None:   # the boundary carries the token count
                tt, tu = tt + layered.tokens, tu + layered.tokens
            else:
                tt, tu = count_tokens(tt, tu, tok_mask, flat_mask, feeds)
            work = []
            for i in group:
                name, K = acts[i]
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
            stats.run(accs, work)
            del work
            log_batch(gi, len(groups), bi, batches.n_batches, t1, t2, time.time())
        tokens_total, tokens_unpadded = tt, tu
        del sess
        if layered is not None and gi == 0:
            layered.finish_next()
        for i in group:
            acc = accs.pop(i)
            # An inf/nan statistic makes every AWQ/clip loss non-finite: the search could only guess.
            if acc.nonfinite or (acc.gram is not None and not np.isfinite(acc.gram).all()) or \
                    (a.gram_block > 0 and not np.isfinite(acc.gblocks).all()):
                raise CalibError(f"{model_path}: activation '{acc.name}' takes non-finite values (inf/nan) on "
                                 f"the calibration data, so its statistics cannot guide the search (check the "
                                 f"inputs; an fp16 model may overflow: use rtn_dq, or calibrate an fp32 export)")
            files = {"mean_abs_np": f"a{i}.mean_abs_np.f32", "sum_abs": f"a{i}.sum_abs.f64",
                     "gram": f"a{i}.gram.f64"}
            try:
                write_array(os.path.join(out_dir, files["mean_abs_np"]), acc.mean_abs_np(), "<f4")
                write_array(os.path.join(out_dir, files["sum_abs"]), acc.sum_abs, "<f8")
                if a.gram_block > 0:
                    files["gram"] = f"a{i}.gram_blocks.f64"
                    write_array(os.path.join(out_dir, files["gram"]), acc.gblocks, "<f8")
                else:
                    write_array(os.path.join(out_dir, files["gram"]), acc.gram_f64(), "<f8")
            except OSError as e:
                raise CalibError(f"--out {a.out}: cannot write ({e.strerror or e})") from None
            entries[i] = {"name": acc.name, "K": acc.K, "rows": acc.rows, "rows_all": acc.rows_all, **files}
            if a.gram_block > 0:
                entries[i]["gram_block"] = a.gram_block
            if samplers:
                smp = samplers.pop(i)
                rows = smp.rows(acc.K)
                f = f"a{i}.token_sample.f32"
                try:
                    write_array(os.path.join(out_dir, f), rows, "<f4")
                except OSError as e:
                    raise CalibError(f"--out {a.out}: cannot write ({e.strerror or e})") from None
                entries[i].update({"token_sample": f, "token_sample_rows": int(rows.shape[0]),
                                   "token_sample_step": smp.step, "token_sample_dtype": smp.dtype})
            del acc

    stats.close()
    kill_point("calib_capture_written")
    index = {"version": INDEX_VERSION, "samples": batches.samples, "seq_len": batches.seq_len,
             "batch_size": batches.batch_size, "provider": provider_used or providers[0][0],
             "mask_padding": bool(a.mask_padding), "tokens_total": tokens_total,
             "tokens_unpadded": tokens_unpadded, "passes": len(groups), "source": batches.source,
             "stats": "session" if in_session else "numpy",
             "activations": entries}
    try:
        tmp = os.path.join(out_dir, "index.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=1)
        os.replace(tmp, os.path.join(out_dir, "index.json"))
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot write index.json ({e.strerror or e})") from None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"done: {len(acts)} activations, {tokens_total} tokens, {len(groups)} pass(es), "
        f"{time.time() - t0:.1f} s, peak RSS {rss:.0f} MiB")
    return 0

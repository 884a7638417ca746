#!/usr/bin/env python3
"""What `nibble eval` runs: perplexity of an ORT-GenAI-style ONNX causal LM and, with --reference,
the KL divergence of its next-token distribution from a reference (float) model's.

    nibble eval --model Q/model.onnx [--reference F/model.onnx] [--text FILE] [--windows 32] [--seq_len 256]
                [--json OUT.json]
    .venv/bin/python tools/eval_model.py Q/model.onnx [--reference F/model.onnx] ...     # the same, directly

Windows: the text (default: the corpus EVAL split, tools/corpus.py, never used for calibration; or a
.txt file; or a .jsonl file with a "text" field per line, documents joined by a blank line) is
tokenized once with the model's tokenizer and cut into consecutive, non-overlapping windows of
--seq_len tokens, the first --windows of them; each window is one forward pass from an empty KV cache
(tools/eval_ppl.py's Decoder: attention_mask, position_ids and past KV built from the model's inputs).
A text with fewer tokens than windows x seq_len is an error (no silent shrinking of the measurement).

Measures, over the L-1 predicted positions of every window (tokens 2..L):
  ppl             exp(mean NLL) of the model: the same windows and arithmetic as tools/eval_ppl.py
  ref_ppl         the same for the reference
  kl              mean over positions of KL(P_ref || P_model) = sum_v p_ref(v) (log p_ref(v) - log p_model(v)),
                  in nats per token, float64 log-softmax of both logits
  top1_agreement  share of positions where both models' most likely next token is the same
The reference and the model run window by window (two ONNX Runtime sessions): only one window's
logits of each are held (KL computed in chunks of positions), whatever --windows is.
ORT's session.qdq_matmulnbits_accuracy_level is pinned to --accuracy_level (default 1: fp32 compute).

stdout: a human-readable summary; --json FILE: the same measurements as JSON.  Errors: one line
"eval: ..." on stderr, exit 2 (nibble prints it as "nibble: error: eval: ...").
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def _check_requirements(names: tuple[str, ...]) -> None:
    """One line naming what this Python lacks and how to fix it (nibble may run a python3 that was
    never set up for it); the requirements file is installed beside calibration's scripts."""
    import importlib.util
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        req = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "calib", "requirements.txt")
        print(f"eval: the Python {sys.executable} lacks the package(s) {', '.join(missing)}: "
              f"run `{sys.executable} -m pip install -r {req}`, or set NIBBLE_PYTHON to a Python that has them",
              file=sys.stderr, flush=True)
        sys.exit(2)


_check_requirements(("numpy", "onnxruntime", "tokenizers"))
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KL_CHUNK = 64  # positions per log-softmax chunk: 64 x 49152 float64 = 25 MB per array


class EvalError(Exception):
    """A one-line, user-facing error."""


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def read_text(path: str) -> str:
    """The text of a .txt file, or of a .jsonl file's "text" fields joined by a blank line."""
    if not os.path.exists(path):
        raise EvalError(f"--text {path}: no such file")
    if not os.path.isfile(path):
        raise EvalError(f"--text {path}: not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise EvalError(f"--text {path}: cannot read it ({e.strerror or e})") from None
    data = raw.decode("utf-8", errors="replace")
    if not path.lower().endswith(".jsonl"):
        return data
    texts = []
    for no, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise EvalError(f"--text {path}: line {no} is not JSON ({_first_line(e)})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise EvalError(f"--text {path}: line {no} has no string field \"text\"")
        texts.append(obj["text"])
    return "\n\n".join(texts)


def text_windows(tok, text_path: str | None, windows: int, seq_len: int) -> tuple[np.ndarray, str]:
    """[windows, seq_len] int64 token ids and a description of where they come from."""
    if text_path:
        text, what = read_text(text_path), text_path
    else:
        import corpus
        try:
            text = corpus.eval_stream()
        except OSError as e:
            raise EvalError(f"cannot read the corpus ({_first_line(e)}; set NIBBLE_CORPUS or give --text)") from None
        what = "corpus eval split (tools/corpus.py)"
    ids = np.asarray(tok.encode(text).ids, dtype=np.int64)
    avail = len(ids) // seq_len
    if avail < windows:
        hint = f"use --windows {avail}" if avail else "use a smaller --seq_len or a longer text"
        raise EvalError(f"{what} has {len(ids)} tokens: {avail} window(s) of {seq_len} at most, "
                        f"{windows} asked for ({hint})")
    return ids[: windows * seq_len].reshape(windows, seq_len), what


def _log_softmax(lg: np.ndarray) -> np.ndarray:
    lg = lg.astype(np.float64)
    m = lg.max(-1, keepdims=True)
    return lg - (np.log(np.exp(lg - m).sum(-1, keepdims=True)) + m)


def kl_and_agreement(ref_logits: np.ndarray, logits: np.ndarray) -> tuple[float, int]:
    """(sum over positions of KL(P_ref || P), positions whose argmax agree); logits [S, V]."""
    kl, agree = 0.0, 0
    for s in range(0, ref_logits.shape[0], KL_CHUNK):
        lr = _log_softmax(ref_logits[s: s + KL_CHUNK])
        lq = _log_softmax(logits[s: s + KL_CHUNK])
        kl += float((np.exp(lr) * (lr - lq)).sum())
        agree += int((lr.argmax(-1) == lq.argmax(-1)).sum())
    return kl, agree


def _open(path: str, role: str, accuracy_level, threads: int):
    import eval_ppl
    if not os.path.exists(path):
        raise EvalError(f"{role} {path}: no such file")
    if not os.path.isfile(path):
        raise EvalError(f"{role} {path}: not a regular file")
    try:
        sess = eval_ppl.make_session(path, accuracy_level, threads)
    except Exception as e:  # noqa: BLE001 - ORT raises its own types
        raise EvalError(f"{role} {path}: ONNX Runtime cannot load it ({_first_line(e)})") from None
    try:
        return eval_ppl.Decoder(sess, path)
    except ValueError as e:
        raise EvalError(f"{role} {path}: {_first_line(e)}") from None


def _vocab(dec) -> int | None:
    """The logits' last dimension when the model declares it (checked before anything runs)."""
    for o in dec.sess.get_outputs():
        if o.name == "logits" and o.shape and isinstance(o.shape[-1], int):
            return int(o.shape[-1])
    return None


def evaluate(model: str, reference: str | None = None, text: str | None = None, windows: int = 32,
             seq_len: int = 256, tokenizer: str | None = None, accuracy_level: str | None = "1",
             threads: int = 0, log=None) -> dict:
    import eval_ppl
    if windows < 1:
        raise EvalError("--windows must be at least 1")
    if seq_len < 2:
        raise EvalError("--seq_len must be at least 2")
    t0 = time.time()
    dec = _open(model, "--model", accuracy_level, threads)
    ref = _open(reference, "--reference", accuracy_level, threads) if reference else None
    try:
        tok = eval_ppl.load_tokenizer(model, tokenizer)
    except FileNotFoundError:
        where = tokenizer or os.path.dirname(os.path.abspath(model))
        raise EvalError(f"no tokenizer.json in {where} (give --tokenizer)") from None
    except ImportError as e:
        raise EvalError(f"the Python package '{e.name or 'tokenizers'}' is not installed in {sys.executable} "
                        f"(run scripts/setup)") from None
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own types
        raise EvalError(f"cannot load the tokenizer ({_first_line(e)})") from None
    data, what = text_windows(tok, text, windows, seq_len)
    t1 = time.time()
    nll = ref_nll = kl = 0.0
    agree = n = 0
    kl_windows = []
    vocab = _vocab(dec)
    if vocab is not None and int(data.max()) >= vocab:
        raise EvalError(f"the tokenizer gives token ids up to {int(data.max())} but --model {model} has "
                        f"{vocab} logits (wrong --tokenizer?)")

    def run(d, role: str, path: str, w: int):
        try:
            return d.run(data[w: w + 1])[0]
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's own exception types
            raise EvalError(f"{role} {path}: ONNX Runtime failed on window {w + 1} ({_first_line(e)})") from None

    for w in range(windows):
        batch = data[w: w + 1]
        logits = run(dec, "--model", model, w)
        if int(batch.max()) >= logits.shape[-1]:
            raise EvalError(f"the tokenizer gives token ids up to {int(batch.max())} but --model {model} has "
                            f"{logits.shape[-1]} logits (wrong --tokenizer?)")
        nll += eval_ppl._nll(logits[:-1], batch[0, 1:])
        if ref is not None:
            ref_logits = run(ref, "--reference", reference, w)
            if ref_logits.shape != logits.shape:
                raise EvalError(f"--reference {reference} gives logits {list(ref_logits.shape)}, --model "
                                f"{list(logits.shape)}: not the same vocabulary")
            ref_nll += eval_ppl._nll(ref_logits[:-1], batch[0, 1:])
            k, a = kl_and_agreement(ref_logits[:-1], logits[:-1])
            kl += k
            agree += a
            kl_windows.append(k / (seq_len - 1))
            del ref_logits
        n += seq_len - 1
        del logits
        if log and (w + 1 == windows or (w + 1) % max(1, windows // 8) == 0):
            extra = f", KL {kl / n:.5f}" if ref is not None else ""
            log(f"nibble eval: window {w + 1}/{windows}: ppl {math.exp(nll / n):.4f}{extra} ({time.time() - t1:.0f} s)")
    t2 = time.time()
    res = {"tool": "nibble eval", "model": model, "reference": reference, "text": what,
           "tokenizer": tokenizer or os.path.join(os.path.dirname(os.path.abspath(model)), "tokenizer.json"),
           "windows": windows, "seq_len": seq_len, "tokens": n,
           "ppl": math.exp(nll / n), "nll": nll / n}
    if ref is not None:
        res.update(ref_ppl=math.exp(ref_nll / n), ref_nll=ref_nll / n, ppl_change=math.exp(nll / n - ref_nll / n) - 1,
                   kl=kl / n, kl_max_window=max(kl_windows), top1_agreement=agree / n, kl_windows=kl_windows)
    res.update(accuracy_level=None if accuracy_level is None else str(accuracy_level),
               seconds=round(t2 - t1, 3), load_seconds=round(t1 - t0, 3))
    return res


def summary(r: dict) -> str:
    lines = [f"nibble eval: {r['windows']} windows x {r['seq_len']} tokens of {r['text']} "
             f"({r['tokens']} predicted tokens)",
             f"  model      {r['model']}",
             f"             perplexity {r['ppl']:.4f}"]
    if r.get("reference"):
        lines += [f"  reference  {r['reference']}",
                  f"             perplexity {r['ref_ppl']:.4f}",
                  f"  perplexity change   {100 * r['ppl_change']:+.2f} %",
                  f"  KL(reference || model)  {r['kl']:.6f} nats/token (largest window mean {r['kl_max_window']:.6f})",
                  f"  top-1 agreement     {100 * r['top1_agreement']:.2f} %"]
    lines.append(f"  {r['seconds']:.1f} s ({r['load_seconds']:.1f} s loading)")
    return "\n".join(lines)


def check_json_path(path: str) -> None:
    """Fails early (before minutes of evaluation) when --json cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise EvalError(f"--json {path}: cannot create the folder {folder} ({e.strerror or e})") from None
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise EvalError(f"--json {path}: cannot write it")


def write_json(path: str, obj: dict) -> None:
    p = os.path.abspath(path)
    tmp = p + ".nibble-part"
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise EvalError(f"--json {path}: cannot write it ({e.strerror or e})") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise EvalError(f"command line: {message}")


def main(argv=None) -> int:
    ap = _Parser(description="perplexity and KL divergence against a reference model (nibble eval)")
    ap.add_argument("model", help="model.onnx to measure (tokenizer.json beside it)")
    ap.add_argument("--reference", default=None, help="reference (float) model.onnx")
    ap.add_argument("--text", default=None, help=".txt or .jsonl; default: the corpus eval split")
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json or its folder")
    ap.add_argument("--accuracy_level", default="1", help="'' leaves ORT's default")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the measurements here")
    ap.add_argument("--quiet", action="store_true")
    try:
        a = ap.parse_args(argv)
        try:
            import onnxruntime as ort
            ort.set_default_logger_severity(3)
        except ImportError:
            raise EvalError("the Python package 'onnxruntime' is not installed (scripts/setup)") from None
        if a.json:
            check_json_path(a.json)
        log = None if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        res = evaluate(a.model, a.reference, a.text, a.windows, a.seq_len, a.tokenizer, a.accuracy_level or None,
                       a.threads, log)
        if a.json:
            write_json(a.json, res)
        print(summary(res), flush=True)
        return 0
    except EvalError as e:
        print(f"eval: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("eval: interrupted", file=sys.stderr, flush=True)
        return 130
    except MemoryError:
        print("eval: out of memory", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # noqa: BLE001 - never a traceback
        if os.environ.get("NIBBLE_EVAL_TRACEBACK"):
            import traceback
            traceback.print_exc()
        print(f"eval: internal error: {type(e).__name__}: {_first_line(e)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

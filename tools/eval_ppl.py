#!/usr/bin/env python3
"""Perplexity of an ORT-GenAI-style ONNX causal LM on the eval split of tools/corpus.py.

Works with any decoder that has the builder's interface: input_ids, attention_mask, optional
position_ids, past_key_values.N.key/value (fed empty: batch x kv_heads x 0 x head_size, dtype and
head counts read from the model's own inputs, else from genai_config.json), output `logits`.
fp32, fp16 and quantized (DequantizeLinear / QDQ / MatMulNBits) models alike.

The eval split (or --split calib: held-out text too for a method that reads no calibration data, such as
RTN) is tokenized once (tokenizer.json beside the model, or --tokenizer) and cut into
consecutive, non-overlapping windows of --seq_len tokens; each window is one forward pass from an
empty cache; ppl = exp(mean NLL of tokens 2..L of every window). Runs on ONNX Runtime's CPU
provider (or --provider), with session option session.qdq_matmulnbits_accuracy_level pinned
(--accuracy_level, default "1" = fp32 compute, so results do not depend on the CPU's int8 paths).

    python tools/eval_ppl.py build/smollm2-fp32/model.onnx [--windows 32 --seq_len 256 --samples 2]

Prints one JSON line: {"model", "ppl", "windows", "seq_len", "tokens", "seconds", ...}.
Library: from eval_ppl import eval_ppl; eval_ppl("model.onnx", windows=8)["ppl"]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SAMPLE_PROMPTS = [
    "The capital of France is",
    "A hacker is a person who",
    "The best way to learn a programming language is",
    "Once upon a time, there was a little robot that",
    "The three primary colors are",
    "In the morning, I like to",
    "The main difference between a compiler and an interpreter is",
    "Water boils at a temperature of",
]

_ORT_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": None,
           "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def make_session(model_path: str, accuracy_level: str | int | None = "1", threads: int = 0,
                 provider: str = "CPUExecutionProvider"):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = int(threads)
    if accuracy_level is not None and str(accuracy_level) != "":
        so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(accuracy_level))
    return ort.InferenceSession(model_path, so, providers=[provider])


def load_tokenizer(model_path: str, tokenizer: str | None = None):
    from tokenizers import Tokenizer
    cands = [tokenizer] if tokenizer else []
    d = os.path.dirname(os.path.abspath(model_path))
    cands += [os.path.join(d, "tokenizer.json")]
    for c in cands:
        if c and os.path.isdir(c):
            c = os.path.join(c, "tokenizer.json")
        if c and os.path.exists(c):
            return Tokenizer.from_file(c)
    raise FileNotFoundError(f"no tokenizer.json beside {model_path} (give --tokenizer)")


class Decoder:
    """Feeds an ORT-GenAI-style decoder: builds attention_mask / position_ids / past KV."""

    def __init__(self, sess, model_path: str | None = None):
        self.sess = sess
        self.inputs = {i.name: i for i in sess.get_inputs()}
        self.out_names = [o.name for o in sess.get_outputs()]
        if "logits" not in self.out_names:
            raise ValueError(f"model has no 'logits' output (outputs: {self.out_names[:5]}...)")
        self.present_names = [n for n in self.out_names if n.startswith("present")]
        cfg = {}
        if model_path:
            p = os.path.join(os.path.dirname(os.path.abspath(model_path)), "genai_config.json")
            if os.path.exists(p):
                with open(p) as f:
                    cfg = json.load(f).get("model", {}).get("decoder", {})
        self.past = {}
        for name, inp in self.inputs.items():
            if not name.startswith("past_key_values"):
                continue
            shape = list(inp.shape)
            kv = shape[1] if isinstance(shape[1], int) else cfg.get("num_key_value_heads")
            hs = shape[3] if len(shape) > 3 and isinstance(shape[3], int) else cfg.get("head_size")
            if kv is None or hs is None:
                raise ValueError(f"cannot tell KV heads / head size of input {name} {shape}")
            dt = _ORT_NP.get(inp.type)
            if dt is None:
                raise ValueError(f"unsupported past KV type {inp.type} for {name}")
            self.past[name] = (int(kv), int(hs), dt)
        self.vocab = None

    def _present_to_past(self, name: str) -> str:
        # present.N.key -> past_key_values.N.key (builder naming)
        return name.replace("present", "past_key_values", 1)

    def run(self, ids: np.ndarray, past: dict | None = None, want_present: bool = False):
        """ids [B, S] int64. past: dict past-name -> array, or None for an empty cache.
        Returns logits [B, S, V] float32 (and the new past dict if want_present)."""
        ids = np.asarray(ids, dtype=np.int64)
        B, S = ids.shape
        feeds = {}
        past_len = 0
        for name, (kv, hs, dt) in self.past.items():
            if past is not None and name in past:
                feeds[name] = past[name]
                past_len = past[name].shape[2]
            else:
                feeds[name] = np.zeros((B, kv, 0, hs), dtype=dt)
        if "input_ids" in self.inputs:
            feeds["input_ids"] = ids
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones((B, past_len + S), dtype=np.int64)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.broadcast_to(np.arange(past_len, past_len + S, dtype=np.int64), (B, S)).copy()
        names = ["logits"] + (self.present_names if want_present else [])
        res = self.sess.run(names, feeds)
        logits = res[0].astype(np.float32, copy=False)
        if not want_present:
            return logits
        new_past = {self._present_to_past(n): a for n, a in zip(names[1:], res[1:])}
        return logits, new_past

    def greedy(self, tok, prompt: str, new_tokens: int = 32, eos: int | None = None) -> str:
        ids = tok.encode(prompt).ids
        logits, past = self.run(np.array([ids]), None, want_present=True)
        out = []
        for _ in range(new_tokens):
            nxt = int(np.argmax(logits[0, -1]))
            if eos is not None and nxt == eos:
                break
            out.append(nxt)
            logits, past = self.run(np.array([[nxt]]), past, want_present=True)
        return tok.decode(out)


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Sum of -log p(target) over positions; logits [S, V] float32."""
    lg = logits.astype(np.float64)
    m = lg.max(-1, keepdims=True)
    lse = np.log(np.exp(lg - m).sum(-1)) + m[:, 0]
    return float((lse - lg[np.arange(len(targets)), targets]).sum())


def eval_tokens(tok, seq_len: int, windows: int, split: str = "eval") -> np.ndarray:
    """First windows*seq_len tokens of the split (eval unless told), as [windows, seq_len]."""
    from corpus import split_stream
    ids = np.asarray(tok.encode(split_stream(split)).ids, dtype=np.int64)
    avail = len(ids) // seq_len
    if windows > avail:
        raise ValueError(f"{split} split has {len(ids)} tokens: at most {avail} windows of {seq_len}")
    return ids[: windows * seq_len].reshape(windows, seq_len)


def eval_ppl(model_path: str, windows: int = 32, seq_len: int = 256, batch_size: int = 1,
             accuracy_level: str | int | None = "1", samples: int = 0, sample_tokens: int = 32,
             tokenizer: str | None = None, threads: int = 0, provider: str = "CPUExecutionProvider",
             log=None, split: str = "eval") -> dict:
    t0 = time.time()
    sess = make_session(model_path, accuracy_level, threads, provider)
    dec = Decoder(sess, model_path)
    tok = load_tokenizer(model_path, tokenizer)
    data = eval_tokens(tok, seq_len, windows, split)
    t1 = time.time()
    nll, n, per_window = 0.0, 0, []
    for s in range(0, windows, batch_size):
        batch = data[s: s + batch_size]
        logits = dec.run(batch)
        for b in range(batch.shape[0]):
            w = _nll(logits[b, :-1], batch[b, 1:])
            nll += w
            n += seq_len - 1
            per_window.append(round(float(w) / (seq_len - 1), 6))
        if log:
            log(f"  windows {s + batch.shape[0]}/{windows}: running ppl {np.exp(nll / n):.4f}")
    t2 = time.time()
    res = {"model": model_path, "ppl": float(np.exp(nll / n)), "nll": nll / n, "windows": windows,
           "seq_len": seq_len, "split": split, "tokens": n, "accuracy_level": None if accuracy_level is None else str(accuracy_level),
           "seconds": round(t2 - t1, 3), "load_seconds": round(t1 - t0, 3),
           "window_nll": per_window}  # (mean nll per window: what bench/paired_ppl.py compares)
    if samples:
        eos = None
        p = os.path.join(os.path.dirname(os.path.abspath(model_path)), "genai_config.json")
        if os.path.exists(p):
            with open(p) as f:
                eos = json.load(f).get("model", {}).get("eos_token_id")
            if isinstance(eos, list):
                eos = eos[0]
        res["samples"] = [{"prompt": pr, "output": dec.greedy(tok, pr, sample_tokens, eos)}
                          for pr in SAMPLE_PROMPTS[:samples]]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="perplexity of an ORT-GenAI-style ONNX LM on the corpus eval split")
    ap.add_argument("model", help="model.onnx (tokenizer.json and genai_config.json beside it)")
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--seq_len", type=int, default=256)
    ap.add_argument("--batch_size", type=int, default=1)
    ap.add_argument("--accuracy_level", default="1",
                    help="session.qdq_matmulnbits_accuracy_level ('' to leave ORT's default)")
    ap.add_argument("--samples", type=int, default=0, help="greedy generations to print")
    ap.add_argument("--sample_tokens", type=int, default=32)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json or its folder")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--provider", default="CPUExecutionProvider")
    ap.add_argument("--split", choices=["eval", "calib"], default="eval",
                    help="corpus split to read (calib: held-out text only for methods without calibration)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    log = (lambda m: print(m, file=sys.stderr)) if a.verbose else None
    res = eval_ppl(a.model, a.windows, a.seq_len, a.batch_size, a.accuracy_level or None, a.samples,
                   a.sample_tokens, a.tokenizer, a.threads, a.provider, log, a.split)
    for s in res.get("samples", []):
        print(f"[sample] {s['prompt']!r} -> {s['output']!r}", file=sys.stderr)
    print(json.dumps(res, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The converter's independent check: a plain numpy forward pass on the GGUF tensors as stored, and the
ONNX Runtime helpers that `--verify` compares it with.

The numpy pass follows llama.cpp's semantics, not the ONNX graph's: for `llama` the Q/K rows stay in
the GGUF's permuted order and the rotary turns adjacent pairs (x[2i], x[2i+1]) (llama.cpp's "normal"
rope); for `qwen2` (stored unpermuted, llama.cpp's NEOX rope) it turns (x[i], x[i + hd/2]) and adds
the q/k/v biases. float32 weights, float64 norms, rotary and softmax. It runs a list of prompts layer
by layer, so only one layer's weights need be dequantized at a time (a 1.5B model's fp32 weights
would be 6 GB).
"""
from __future__ import annotations

import json
import os

import numpy as np

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
BIASES = ("attn_q", "attn_k", "attn_v")


class NumpyLlama:
    """Decoder-only forward (llama / qwen2) on the GGUF tensors. keep_weights: cache every layer
    after its first use (fast repeated calls on a small model); else dequantize per call."""

    def __init__(self, gm, keep_weights: bool = True):
        self.gm, self.c, self.keep = gm, gm.config(), keep_weights
        self.arch = getattr(gm, "arch", "llama")
        self._cache: dict[int, dict] = {}
        hd = self.c["head_dim"]
        self.inv_freq = 1.0 / (self.c["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))

    def _layer(self, i: int) -> dict:
        if i in self._cache:
            return self._cache[i]
        p = f"blk.{i}."
        w = {k: self.gm.raw(p + k + ".weight") for k in LAYER_TENSORS}
        for k in BIASES:
            if self.gm.has(p + k + ".bias"):
                w[k + ".bias"] = self.gm.raw(p + k + ".bias")
        if self.keep:
            self._cache[i] = w
        return w

    def _rms(self, x, w):
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.c["rms_eps"])
        return (y * w).astype(np.float32)

    def _rope(self, x, pos):
        """x [S, n, hd]: adjacent pairs (llama, permuted rows) or halves (qwen2, NEOX)."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]          # [S, hd/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        half = x.shape[-1] // 2
        sl = (slice(0, None, 2), slice(1, None, 2)) if self.arch == "llama" else (slice(0, half), slice(half, None))
        x0, x1 = x[..., sl[0]].astype(np.float64), x[..., sl[1]].astype(np.float64)
        out = np.empty(x.shape, dtype=np.float64)
        out[..., sl[0]] = x0 * cos - x1 * sin
        out[..., sl[1]] = x0 * sin + x1 * cos
        return out.astype(np.float32)

    def _proj(self, h, Lw, k):
        y = h @ Lw[k].T
        return y + Lw[k + ".bias"] if k + ".bias" in Lw else y

    def _attention(self, x, Lw):
        nh, nkv, hd = self.c["num_heads"], self.c["num_kv_heads"], self.c["head_dim"]
        S = x.shape[0]
        pos = np.arange(S)
        h = self._rms(x, Lw["attn_norm"])
        q = self._rope(self._proj(h, Lw, "attn_q").reshape(S, nh, hd), pos)
        k = self._rope(self._proj(h, Lw, "attn_k").reshape(S, nkv, hd), pos)
        v = self._proj(h, Lw, "attn_v").reshape(S, nkv, hd)
        mask = np.triu(np.full((S, S), -np.inf), k=1)
        rep = nh // nkv
        out = np.empty((S, nh, hd), dtype=np.float32)
        for hh in range(nh):
            kh = hh // rep
            s = (q[:, hh, :].astype(np.float64) @ k[:, kh, :].T.astype(np.float64)) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, hh, :] = (s @ v[:, kh, :].astype(np.float64)).astype(np.float32)
        return x + out.reshape(S, nh * hd) @ Lw["attn_output"].T

    def _mlp(self, x, Lw):
        h = self._rms(x, Lw["ffn_norm"])
        gte = h @ Lw["ffn_gate"].T
        act = (gte / (1.0 + np.exp(-gte.astype(np.float64)))).astype(np.float32)
        return x + (act * (h @ Lw["ffn_up"].T)) @ Lw["ffn_down"].T

    def forward_many(self, prompts) -> list[np.ndarray]:
        """prompts: list of 1-D token ids. Returns logits [S, V] float32 per prompt (causal, from 0)."""
        emb = self.gm.raw("token_embd.weight")
        xs = [emb[np.asarray(ids, dtype=np.int64)] for ids in prompts]
        lm = self.gm.raw("output.weight") if self.gm.has("output.weight") else emb
        del emb
        for i in range(self.c["num_layers"]):
            Lw = self._layer(i)
            xs = [self._mlp(self._attention(x, Lw), Lw) for x in xs]
        norm = self.gm.raw("output_norm.weight")
        return [self._rms(x, norm) @ lm.T for x in xs]

    def forward(self, ids) -> np.ndarray:
        return self.forward_many([ids])[0]


# ----------------------------------------------------------------------------------------------
# ORT helpers
# ----------------------------------------------------------------------------------------------

def ort_session(model_path: str, threads: int = 0):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])


def ort_forward(sess, ids, past=None):
    """One run. ids: 1-D list/array; past: dict name->array or None. Returns (logits [S,V] fp32, present)."""
    ids = np.asarray(ids, dtype=np.int64)[None, :]
    feeds = {"input_ids": ids}
    past_len = 0
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values."):
            if past is None:
                dt = np.float16 if "float16" in inp.type else np.float32
                feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), dtype=dt)
            else:
                a = past[inp.name.replace("past_key_values.", "present.")]
                feeds[inp.name] = a
                past_len = a.shape[2]
    feeds["attention_mask"] = np.ones((1, past_len + ids.shape[1]), dtype=np.int64)
    names = [o.name for o in sess.get_outputs()]
    res = dict(zip(names, sess.run(names, feeds)))
    return res["logits"][0].astype(np.float32), {k: v for k, v in res.items() if k.startswith("present.")}


def greedy(sess, tok, prompt: str, new_tokens: int = 24, eos: int | None = None) -> str:
    ids = tok.encode(prompt).ids
    logits, past = ort_forward(sess, ids)
    out = []
    for _ in range(new_tokens):
        nxt = int(np.argmax(logits[-1]))
        if eos is not None and nxt == eos:
            break
        out.append(nxt)
        logits, past = ort_forward(sess, [nxt], past)
    return tok.decode(out)


VERIFY_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


def _prompt_nll(logits: np.ndarray, ids) -> float:
    lp = logits[:-1].astype(np.float64)
    lp = lp - lp.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    return float(-lp[np.arange(len(ids) - 1), ids[1:]].sum())


# What --verify accepts, by the model's dtype: max |logit difference| and the prompts' perplexity ratio.
# fp16 activations round at every node (~1e-3 relative each), so its logits drift by a tenth or two.
VERIFY_LOGIT_ATOL = {"fp32": 1e-2, "fp16": 0.5}
VERIFY_PPL_RTOL = 0.01


def verify(out_dir: str, gm, log=print, keep_weights: bool = True) -> dict:
    """numpy logits vs ONNX Runtime's on VERIFY_PROMPTS, their prompt perplexities, a greedy sample;
    res["passed"] says whether both are within VERIFY_LOGIT_ATOL / VERIFY_PPL_RTOL."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in VERIFY_PROMPTS]
    refs = NumpyLlama(gm, keep_weights).forward_many(prompts)
    sess = ort_session(os.path.join(out_dir, "model.onnx"))
    worst, nll_ref, nll_ort, n = 0.0, 0.0, 0.0, 0
    for p, ids, a in zip(VERIFY_PROMPTS, prompts, refs):
        b, _ = ort_forward(sess, ids)
        d = float(np.max(np.abs(a - b)))
        worst = max(worst, d)
        nll_ref += _prompt_nll(a, ids)
        nll_ort += _prompt_nll(b, ids)
        n += len(ids) - 1
        agree = float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))
        log(f"  prompt {p[:40]!r}: {len(ids)} tokens, max|dlogit|={d:.3g} (|logit|max={np.abs(a).max():.1f}), "
            f"argmax agreement {agree:.2f}")
    res = {"max_abs_logit_diff": worst, "ppl_ref": float(np.exp(nll_ref / n)),
           "ppl_ort": float(np.exp(nll_ort / n)), "tokens": n}
    dtype = "fp16" if "float16" in sess.get_outputs()[0].type else "fp32"
    res["passed"] = bool(worst <= VERIFY_LOGIT_ATOL[dtype]
                         and abs(res["ppl_ort"] / res["ppl_ref"] - 1) <= VERIFY_PPL_RTOL)
    log(f"  prompt ppl: numpy {res['ppl_ref']:.4f}  onnx {res['ppl_ort']:.4f}; "
        f"{'PASSED' if res['passed'] else 'FAILED'} ({dtype}: max|dlogit| <= {VERIFY_LOGIT_ATOL[dtype]}, "
        f"ppl within {VERIFY_PPL_RTOL:.0%})")
    eos = json.load(open(os.path.join(out_dir, "genai_config.json")))["model"]["eos_token_id"]
    res["greedy"] = greedy(sess, tok, VERIFY_PROMPTS[0], 16, eos)
    log(f"  greedy: {VERIFY_PROMPTS[0]!r} -> {res['greedy']!r}")
    return res

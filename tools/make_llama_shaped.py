#!/usr/bin/env python3
"""Llama-shaped ONNX models with random weights at real sizes, streamed to disk; and a check that a
quantized copy of one computes what its INT4 weights say, without loading the float model.

Generate (default: Llama-2-7B shapes, fp16, ~13.5 GB; about 2-3 min on 2 cores):

    .venv/bin/python tools/make_llama_shaped.py --out /tmp/l7b/model.onnx
    .venv/bin/python tools/make_llama_shaped.py --out /tmp/small/model.onnx \\
        --hidden 512 --intermediate 1376 --layers 4 --vocab 4000 --heads 8      # a few MB, for tests

Verify (ORT on the quantized model vs a numpy forward pass whose weights are the dequantized INT4
codes of the quantized model's own output files and the float weights of the input, both read
layer by layer with np.memmap):

    .venv/bin/python tools/make_llama_shaped.py --verify /tmp/l7b/model.onnx /tmp/l7b-q/model.onnx \\
        [--tokens 8] [--json r.json]

The model (ORT-GenAI builder names, opset 21, IR 10, runs on ONNX Runtime's CPU provider):

    input_ids int64 [batch, seq]
    /model/embed_tokens/Gather                    model.embed_tokens.weight [V, H]
    per layer N:
      /model/layers.N/input_layernorm/...         RMSNorm in fp32 (Cast, Mul, ReduceMean, Add, Sqrt,
                                                  Div, Cast) * model.layers.N.input_layernorm.weight
      /model/layers.N/attn/qkv_proj/MatMul        [H, 3H]
      /model/layers.N/attn/...                    causal multi-head attention in fp32 (no rotary)
      /model/layers.N/attn/o_proj/MatMul          [H, H]           + residual
      /model/layers.N/post_attention_layernorm/...
      /model/layers.N/mlp/gate_proj/MatMul        [H, I]
      /model/layers.N/mlp/up_proj/MatMul          [H, I]
      /model/layers.N/mlp/act_fn/{Sigmoid,Mul}, /model/layers.N/mlp/Mul   SiLU(gate) * up
      /model/layers.N/mlp/down_proj/MatMul        [I, H]           + residual
    /model/layers.L/final_norm_layernorm/...
    /lm_head/MatMul                               lm_head.MatMul.weight [H, V] -> logits [batch, seq, V]

Every float tensor (weights, norm gammas) is in ONE external data file `<name>.data`, each at a
4096-aligned offset; only the tiny int64 shape/axes constants stay inline (shape inference reads
them).  Weights are N(0, std) (default 0.02, like Llama's init), drawn per tensor from
numpy's default_rng([seed, tensor index]) in chunks of --chunk_mb, converted to the model dtype and
appended to the file: the process holds one chunk, never the model.  Same flags -> same bytes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

DTYPES = {"fp16": (np.float16, 10), "fp32": (np.float32, 1)}
ALIGN = 4096
EPS = 1e-5


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------

def tensor_plan(hidden: int, inter: int, layers: int, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every float tensor in file order; kind 'w' (random) or 'g' (gamma)."""
    H, I = hidden, inter
    out = [("model.embed_tokens.weight", (vocab, H), "w")]
    for n in range(layers):
        q = f"model.layers.{n}"
        out += [(f"{q}.input_layernorm.weight", (H,), "g"),
                (f"{q}.attn.qkv_proj.MatMul.weight", (H, 3 * H), "w"),
                (f"{q}.attn.o_proj.MatMul.weight", (H, H), "w"),
                (f"{q}.post_attention_layernorm.weight", (H,), "g"),
                (f"{q}.mlp.gate_proj.MatMul.weight", (H, I), "w"),
                (f"{q}.mlp.up_proj.MatMul.weight", (H, I), "w"),
                (f"{q}.mlp.down_proj.MatMul.weight", (I, H), "w")]
    out += [(f"model.layers.{layers}.final_norm_layernorm.weight", (H,), "g"),
            ("lm_head.MatMul.weight", (H, vocab), "w")]
    return out


def write_data(path: str, plan, dtype, seed: int, std: float, chunk_elems: int, progress: bool):
    """Streams every tensor of plan into path; returns {name: (offset, length)}."""
    np_dt = DTYPES[dtype][0]
    esize = np.dtype(np_dt).itemsize
    total = sum(math.prod(s) for _, s, _ in plan) * esize
    refs, off, done = {}, 0, 0
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for idx, (name, shape, kind) in enumerate(plan):
            pad = (-off) % ALIGN
            if pad:
                f.write(b"\0" * pad)
                off += pad
            n = math.prod(shape)
            rng = np.random.default_rng([seed, idx])
            left = n
            while left:
                c = min(left, chunk_elems)
                if kind == "g":
                    a = 1.0 + 0.05 * rng.standard_normal(c, dtype=np.float32)
                else:
                    a = rng.standard_normal(c, dtype=np.float32)
                    a *= std
                f.write(a.astype(np_dt).tobytes())
                left -= c
            refs[name] = (off, n * esize)
            off += n * esize
            done += n * esize
            if progress and (kind == "w" or idx == len(plan) - 1):
                el = time.perf_counter() - t0
                print(f"\r  {done / 2**30:6.2f} / {total / 2**30:.2f} GiB  {done / 2**20 / max(el, 1e-9):6.0f} MiB/s  "
                      f"{name}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return refs


def build_graph(args, refs: dict, data_name: str):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    np_dt, et = DTYPES[args.dtype]
    H, I, L, V, NH = args.hidden, args.intermediate, args.layers, args.vocab, args.heads
    HD = H // NH
    nodes, inits = [], []

    def ext(name, shape):
        t = TensorProto()
        t.name = name
        t.data_type = et
        t.dims.extend(shape)
        t.data_location = TensorProto.EXTERNAL
        off, length = refs[name]
        for k, v in (("location", data_name), ("offset", str(off)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        inits.append(t)
        return name

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, inputs, name, n_out=1, **attrs):
        outs = [f"{name}/output_{j}" for j in range(n_out)]
        nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    axes = const("/model/constants/INT64/[-1]", np.array([-1], np.int64))
    eps = const("/model/constants/FLOAT/eps", np.array(EPS, np.float32))
    heads_shape = const("/model/constants/INT64/[0, 0, NH, HD]", np.array([0, 0, NH, HD], np.int64))
    merge_shape = const("/model/constants/INT64/[0, 0, H]", np.array([0, 0, H], np.int64))
    split3 = const("/model/constants/INT64/[H, H, H]", np.array([H, H, H], np.int64))
    scale = const("/model/constants/FLOAT/1/sqrt(head_size)", np.array(1.0 / math.sqrt(HD), np.float32))
    one = const("/model/constants/INT64/1", np.array(1, np.int64))

    def rmsnorm(x, p, gamma):
        xf = node("Cast", [x], f"{p}/Cast", to=TensorProto.FLOAT)
        sq = node("Mul", [xf, xf], f"{p}/Pow")
        ms = node("ReduceMean", [sq, axes], f"{p}/ReduceMean", keepdims=1)
        ad = node("Add", [ms, eps], f"{p}/Add")
        rt = node("Sqrt", [ad], f"{p}/Sqrt")
        y = node("Div", [xf, rt], f"{p}/Div")
        yh = node("Cast", [y], f"{p}/Cast_1", to=et)
        return node("Mul", [yh, ext(gamma, (H,))], f"{p}/Mul_1")

    def matmul(x, p, w, shape):
        return node("MatMul", [x, ext(w, shape)], f"{p}/MatMul")

    h = node("Gather", [ext("model.embed_tokens.weight", (V, H)), "input_ids"], "/model/embed_tokens/Gather", axis=0)
    for n in range(L):
        p, q = f"/model/layers.{n}", f"model.layers.{n}"
        x = rmsnorm(h, f"{p}/input_layernorm", f"{q}.input_layernorm.weight")
        qkv = matmul(x, f"{p}/attn/qkv_proj", f"{q}.attn.qkv_proj.MatMul.weight", (H, 3 * H))
        qkvf = node("Cast", [qkv], f"{p}/attn/Cast", to=TensorProto.FLOAT)
        qs, ks, vs = node("Split", [qkvf, split3], f"{p}/attn/Split", n_out=3, axis=-1)
        heads = [node("Reshape", [t, heads_shape], f"{p}/attn/Reshape_{j}") for j, t in enumerate((qs, ks, vs))]
        qh = node("Transpose", [heads[0]], f"{p}/attn/Transpose_q", perm=[0, 2, 1, 3])
        kh = node("Transpose", [heads[1]], f"{p}/attn/Transpose_k", perm=[0, 2, 3, 1])
        vh = node("Transpose", [heads[2]], f"{p}/attn/Transpose_v", perm=[0, 2, 1, 3])
        sc = node("MatMul", [qh, kh], f"{p}/attn/MatMul_qk")
        sc = node("Mul", [sc, scale], f"{p}/attn/Mul_scale")
        ss = node("Shape", [sc], f"{p}/attn/Shape", start=-2)
        neg = node("ConstantOfShape", [ss], f"{p}/attn/ConstantOfShape",
                   value=helper.make_tensor("v", TensorProto.FLOAT, [1], [-1e9]))
        mask = node("Trilu", [neg, one], f"{p}/attn/Trilu", upper=1)
        sc = node("Add", [sc, mask], f"{p}/attn/Add_mask")
        pr = node("Softmax", [sc], f"{p}/attn/Softmax", axis=-1)
        ctx = node("MatMul", [pr, vh], f"{p}/attn/MatMul_pv")
        ctx = node("Transpose", [ctx], f"{p}/attn/Transpose_out", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_shape], f"{p}/attn/Reshape_out")
        ctx = node("Cast", [ctx], f"{p}/attn/Cast_1", to=et)
        o = matmul(ctx, f"{p}/attn/o_proj", f"{q}.attn.o_proj.MatMul.weight", (H, H))
        h = node("Add", [h, o], f"{p}/attn/residual/Add")
        x = rmsnorm(h, f"{p}/post_attention_layernorm", f"{q}.post_attention_layernorm.weight")
        gate = matmul(x, f"{p}/mlp/gate_proj", f"{q}.mlp.gate_proj.MatMul.weight", (H, I))
        up = matmul(x, f"{p}/mlp/up_proj", f"{q}.mlp.up_proj.MatMul.weight", (H, I))
        sg = node("Sigmoid", [gate], f"{p}/mlp/act_fn/Sigmoid")
        silu = node("Mul", [gate, sg], f"{p}/mlp/act_fn/Mul")
        gu = node("Mul", [silu, up], f"{p}/mlp/Mul")
        down = matmul(gu, f"{p}/mlp/down_proj", f"{q}.mlp.down_proj.MatMul.weight", (I, H))
        h = node("Add", [h, down], f"{p}/mlp/residual/Add")
    x = rmsnorm(h, f"/model/layers.{L}/final_norm_layernorm", f"model.layers.{L}.final_norm_layernorm.weight")
    nodes.append(helper.make_node("MatMul", [x, ext("lm_head.MatMul.weight", (H, V))], ["logits"], name="/lm_head/MatMul"))

    graph = helper.make_graph(nodes, "llama_shaped",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("logits", et, ["batch", "seq", V])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10,
                              producer_name="nibble-make_llama_shaped")
    model.metadata_props.add(key="make_llama_shaped", value=json.dumps(
        {"hidden": H, "intermediate": I, "layers": L, "vocab": V, "heads": NH, "dtype": args.dtype,
         "seed": args.seed, "std": args.std}))
    return model


def generate(args) -> None:
    if args.hidden % args.heads:
        sys.exit(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    data_name = os.path.basename(out) + ".data"
    data_path = os.path.join(os.path.dirname(out), data_name)
    plan = tensor_plan(args.hidden, args.intermediate, args.layers, args.vocab)
    esize = np.dtype(DTYPES[args.dtype][0]).itemsize
    params = sum(math.prod(s) for _, s, _ in plan)
    print(f"make_llama_shaped: H={args.hidden} I={args.intermediate} L={args.layers} V={args.vocab} "
          f"heads={args.heads} {args.dtype}: {params / 1e9:.3f} B params, {params * esize / 1e9:.2f} GB -> {out}",
          file=sys.stderr)
    t0 = time.perf_counter()
    chunk = max(1, args.chunk_mb * 2**20 // 4)
    refs = write_data(data_path + ".part", plan, args.dtype, args.seed, args.std, chunk, not args.quiet)
    model = build_graph(args, refs, data_name)
    import onnx
    with open(out + ".part", "wb") as f:
        f.write(model.SerializeToString())
    os.replace(data_path + ".part", data_path)
    os.replace(out + ".part", out)
    onnx.checker.check_model(out)  # by path: checks the data file is there, does not read it
    el = time.perf_counter() - t0
    size = os.path.getsize(data_path)
    print(f"make_llama_shaped: wrote {out} + {data_name} ({size / 1e9:.2f} GB) in {el:.1f} s "
          f"({size / 2**20 / el:.0f} MiB/s)", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Verification: numpy forward pass, weights streamed from the files
# --------------------------------------------------------------------------------------------

NP_OF = {1: np.float32, 10: np.float16}


class TensorSource:
    """Reads initializers of a model (graph loaded without external data) lazily via np.memmap."""

    def __init__(self, path: str):
        import onnx
        self.path = path
        self.dir = os.path.dirname(os.path.abspath(path))
        self.model = onnx.load(path, load_external_data=False)
        self.inits = {t.name: t for t in self.model.graph.initializer}
        self.producer = {o: n for n in self.model.graph.node for o in n.output}
        self.by_name = {n.name: n for n in self.model.graph.node}
        self._maps = {}

    def raw(self, name: str) -> np.ndarray:
        """uint8 view of the tensor's stored bytes (memmap for external data: nothing read yet)."""
        from onnx import TensorProto
        t = self.inits[name]
        if t.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            p = os.path.join(self.dir, info["location"])
            if p not in self._maps:
                self._maps[p] = np.memmap(p, np.uint8, "r")
            off = int(info.get("offset", 0))
            return self._maps[p][off:off + int(info["length"])]
        if t.HasField("raw_data"):
            return np.frombuffer(t.raw_data, np.uint8)
        from onnx import numpy_helper
        return numpy_helper.to_array(t).view(np.uint8).ravel()

    def release(self) -> None:
        """Unmaps the pages read so far from the process (they stay in the page cache)."""
        import mmap
        for m in self._maps.values():
            mm = getattr(m, "_mmap", None)
            if mm is not None and hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_DONTNEED)

    def array(self, name: str) -> np.ndarray:
        t = self.inits[name]
        return self.raw(name).view(NP_OF[t.data_type]).reshape(tuple(t.dims))

    def weight(self, node_name: str) -> np.ndarray:
        """The B input of MatMul `node_name` as float32 [K, N]: a float initializer, or the output of a
        DequantizeLinear (blocked, axis 0) of INT4/UINT4 codes, computed as ONNX defines it."""
        n = self.by_name[node_name]
        b = n.input[1]
        if b in self.inits:
            return self.array(b).astype(np.float32)
        dq = self.producer.get(b)
        if dq is None or dq.op_type != "DequantizeLinear":
            raise SystemExit(f"{self.path}: {node_name}'s weight {b!r} is neither an initializer nor a "
                             f"DequantizeLinear output (verify supports --format dq)")
        attrs = {a.name: a for a in dq.attribute}
        axis = attrs["axis"].i if "axis" in attrs else 1
        block = attrs["block_size"].i if "block_size" in attrs else 0
        t = self.inits[dq.input[0]]
        K, N = tuple(t.dims)
        if t.data_type not in (21, 22) or axis != 0 or block <= 0:
            raise SystemExit(f"{self.path}: {dq.name}: expected INT4/UINT4 blocked along axis 0")
        codes = unpack4(self.raw(t.name), K * N, t.data_type == 22).reshape(K, N).astype(np.float32)
        scale_t = self.inits[dq.input[1]]
        s = self.array(scale_t.name).astype(np.float32)
        if len(dq.input) > 2 and dq.input[2]:
            zt = self.inits[dq.input[2]]
            z = unpack4(self.raw(zt.name), math.prod(zt.dims), zt.data_type == 22).reshape(tuple(zt.dims))
            codes -= np.repeat(z.astype(np.float32), block, axis=0)[:K]
        w = codes * np.repeat(s, block, axis=0)[:K]
        return w.astype(NP_OF[scale_t.data_type]).astype(np.float32)  # DQ output is in the scale's type


def unpack4(raw: np.ndarray, n: int, signed: bool) -> np.ndarray:
    b = np.asarray(raw, np.uint8)
    out = np.empty(2 * b.size, np.int8 if signed else np.uint8)
    lo, hi = b & 0x0F, b >> 4
    if signed:
        lo = ((lo ^ 8).astype(np.int8) - 8)
        hi = ((hi ^ 8).astype(np.int8) - 8)
    out[0::2], out[1::2] = lo, hi
    return out[:n]


def numpy_forward(src: TensorSource, meta: dict, ids: np.ndarray, weight_src: TensorSource | None = None) -> np.ndarray:
    """Logits [B, S, V] (float32) of the graph build_graph() writes, with fp16 rounding where the graph
    has fp16 tensors.  MatMul weights come from weight_src (the quantized model) when given."""
    wsrc = weight_src or src
    dt = NP_OF[src.inits["model.embed_tokens.weight"].data_type]
    H, L, NH = meta["hidden"], meta["layers"], meta["heads"]
    HD = H // NH

    def r(x):  # round to the model dtype (what an fp16 tensor between two nodes holds)
        return x.astype(dt).astype(np.float32)

    def norm(x, gamma):
        xf = x.astype(np.float32)
        y = r(xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + np.float32(EPS)))
        return r(y * src.array(gamma).astype(np.float32))

    def mm(x, name):
        return r(x @ wsrc.weight(name))

    B, S = ids.shape
    h = r(src.array("model.embed_tokens.weight")[ids].astype(np.float32))
    mask = np.triu(np.full((S, S), -1e9, np.float32), 1)
    for n in range(L):
        p, q = f"/model/layers.{n}", f"model.layers.{n}"
        x = norm(h, f"{q}.input_layernorm.weight")
        qkv = mm(x, f"{p}/attn/qkv_proj/MatMul")
        qh, kh, vh = (qkv[..., j * H:(j + 1) * H].reshape(B, S, NH, HD).transpose(0, 2, 1, 3) for j in range(3))
        sc = (qh @ kh.transpose(0, 1, 3, 2)) * np.float32(1.0 / math.sqrt(HD)) + mask
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        pr = sc / sc.sum(-1, keepdims=True)
        ctx = r((pr @ vh).transpose(0, 2, 1, 3).reshape(B, S, H))
        h = r(h + mm(ctx, f"{p}/attn/o_proj/MatMul"))
        x = norm(h, f"{q}.post_attention_layernorm.weight")
        g = mm(x, f"{p}/mlp/gate_proj/MatMul")
        u = mm(x, f"{p}/mlp/up_proj/MatMul")
        a = r(r(g * r(1.0 / (1.0 + np.exp(-g)))) * u)
        h = r(h + mm(a, f"{p}/mlp/down_proj/MatMul"))
        src.release()  # drop this layer's mapped pages: RSS stays at about one layer
        wsrc.release()
    x = norm(h, f"model.layers.{L}.final_norm_layernorm.weight")
    return mm(x, "/lm_head/MatMul")


def ort_logits(path: str, ids: np.ndarray, optimize: bool) -> np.ndarray:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")  # fp32 compute in MatMulNBits
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input_ids": ids})[0].astype(np.float32)


def verify(args) -> int:
    import resource
    fsrc = TensorSource(args.verify[0])
    qsrc = TensorSource(args.verify[1])
    meta = json.loads({p.key: p.value for p in fsrc.model.metadata_props}["make_llama_shaped"])
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, meta["vocab"], (1, args.tokens), dtype=np.int64)
    res = {"float_model": args.verify[0], "quant_model": args.verify[1], "tokens": ids.ravel().tolist(), **meta}
    def peak_mb():
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    t = time.perf_counter()
    ref_q = numpy_forward(fsrc, meta, ids, weight_src=qsrc)
    res["numpy_quant_s"] = round(time.perf_counter() - t, 1)
    res["peak_rss_mb_after_numpy_quant"] = peak_mb()
    t = time.perf_counter()
    ref_f = numpy_forward(fsrc, meta, ids) if not args.no_float else None
    res["numpy_float_s"] = round(time.perf_counter() - t, 1)
    res["peak_rss_mb_after_numpy_float"] = peak_mb()
    del fsrc, qsrc
    t = time.perf_counter()
    got = ort_logits(args.verify[1], ids, optimize=not args.no_optimize)
    res["ort_s"] = round(time.perf_counter() - t, 1)
    res["peak_rss_mb"] = peak_mb()

    def cmp(a, b):
        d = np.abs(a - b)
        return {"max_abs": float(d.max()), "rms": float(np.sqrt(np.mean(d * d))),
                "rel_rms": float(np.sqrt(np.mean(d * d)) / np.sqrt(np.mean(b * b))),
                "top1_agree": float(np.mean(a.argmax(-1) == b.argmax(-1)))}
    res["logits_rms"] = float(np.sqrt(np.mean(ref_q * ref_q)))
    res["ort_quant_vs_numpy_quant"] = cmp(got, ref_q)
    if ref_f is not None:
        res["numpy_quant_vs_numpy_float"] = cmp(ref_q, ref_f)
    ok = res["ort_quant_vs_numpy_quant"]["rel_rms"] < args.rel_tol
    res["ok"] = bool(ok)
    s = json.dumps(res, indent=2)
    print(s)
    if args.json:
        with open(args.json, "w") as f:
            f.write(s + "\n")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="model path to write (its data goes to OUT.data beside it)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--std", type=float, default=0.02, help="weight standard deviation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk_mb", type=int, default=64, help="float32 chunk generated at a time")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--verify", nargs=2, metavar=("FLOAT_ONNX", "QUANT_ONNX"))
    ap.add_argument("--tokens", type=int, default=8, help="--verify: sequence length (random token ids)")
    ap.add_argument("--no_float", action="store_true", help="--verify: skip the float-weights forward pass")
    ap.add_argument("--no_optimize", action="store_true", help="--verify: ORT without graph optimizations")
    ap.add_argument("--rel_tol", type=float, default=0.02,
                    help="--verify: max rms(ORT - numpy) / rms(numpy) of the quantized logits")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.verify:
        return verify(args)
    if not args.out:
        ap.error("--out or --verify is required")
    generate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

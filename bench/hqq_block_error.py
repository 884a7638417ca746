#!/usr/bin/env python3
"""Per-block weight error of two MatMulNBits models of the same float model (e.g. ONNX Runtime's HQQ
against nibble's --algo hqq --format matmulnbits), on a few weights:

    python3 bench/hqq_block_error.py FLOAT.onnx A.onnx B.onnx [--weights 6]

For each MatMul output the two share, dequantizes B, scales and zero points ((q - z) · s, float zero
points or packed 4-bit ones) and prints the mean squared and mean absolute error against the float
weight, and in how many blocks B's squared error is below A's.
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))


def arrays(path):
    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    return m, lambda n: numpy_helper.to_array(inits[n], base_dir=os.path.dirname(os.path.abspath(path)))


def dequant(node, get):
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    K, N, bs = attrs["K"], attrs["N"], attrs["block_size"]
    b = get(node.input[1])
    q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(N, -1, bs).astype(np.float32)   # [N, G, bs]
    s = get(node.input[2]).astype(np.float32).reshape(N, -1)
    if len(node.input) > 3 and node.input[3]:
        z = get(node.input[3])
        if z.dtype == np.uint8:   # packed 4-bit, low nibble first
            z = np.stack([z & 0x0F, z >> 4], axis=-1).reshape(N, -1)[:, :q.shape[1]]
        z = z.astype(np.float32).reshape(N, -1)
    else:
        z = np.full_like(s, 8.0)
    w = (q - z[:, :, None]) * s[:, :, None]
    return w.reshape(N, -1)[:, :K], bs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("float_model")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--weights", type=int, default=6)
    args = ap.parse_args()
    fm, fget = arrays(args.float_model)
    am, aget = arrays(args.a)
    bm, bget = arrays(args.b)
    fw = {n.output[0]: n.input[1] for n in fm.graph.node if n.op_type == "MatMul"}
    an = {n.output[0]: n for n in am.graph.node if n.op_type == "MatMulNBits"}
    bn = {n.output[0]: n for n in bm.graph.node if n.op_type == "MatMulNBits"}
    common = [o for o in an if o in bn and o in fw]
    pick = common[:: max(1, len(common) // args.weights)][: args.weights]
    print("| output | A mse | B mse | A mean abs | B mean abs | weight rms | blocks B < A / B > A (squared) |\n|---|---:|---:|---:|---:|---:|---:|")
    for o in pick:
        w = fget(fw[o]).astype(np.float32).T                                  # [N, K]
        wa, bs = dequant(an[o], aget)
        wb, _ = dequant(bn[o], bget)
        da, db = (w - wa.astype(np.float32)), (w - wb.astype(np.float32))
        K = w.shape[1]
        G = (K + bs - 1) // bs
        pad = G * bs - K
        ea = np.pad(da ** 2, ((0, 0), (0, pad))).reshape(-1, G, bs).sum(-1)
        eb = np.pad(db ** 2, ((0, 0), (0, pad))).reshape(-1, G, bs).sum(-1)
        print(f"| {o} | {np.mean(da ** 2):.4g} | {np.mean(db ** 2):.4g} | {np.mean(np.abs(da)):.4g} | "
              f"{np.mean(np.abs(db)):.4g} | {np.sqrt(np.mean(w ** 2)):.4g} | {100 * np.mean(eb < ea):.1f}% / "
              f"{100 * np.mean(eb > ea):.1f}% |")


if __name__ == "__main__":
    main()

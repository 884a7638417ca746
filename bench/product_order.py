"""Which K slices make OpenBLAS's sgemm give ONNX Runtime's MatMul bits (kernels::forward_k_slice).

For each shape, one ONNX Runtime session (CPU provider) multiplies random operands, with B a constant (an
initializer, which ONNX Runtime packs) and with B a graph input; OpenBLAS (the library the build links,
on one thread) multiplies the same operands with K in slices of 64..1024, each slice one sgemm added to the
running sum (beta = 1). Prints the fraction of outputs that differ from ONNX Runtime's for each slice, and
the slice forward_k_slice picks.

    .venv/bin/python bench/product_order.py [--blas /lib/x86_64-linux-gnu/libopenblas.so.0]
"""
from __future__ import annotations

import argparse
import ctypes

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

WEIGHT_SHAPES = [(64, 576, 1536), (256, 1536, 576), (1024, 576, 960), (1000, 576, 1536), (100, 4096, 512),
                 (2048, 1536, 8960), (512, 8960, 1536), (37, 512, 200), (37, 300, 1024), (33, 1000, 77),
                 (64, 300, 200)]
ACTIVATION_SHAPES = [(256, 64, 256), (256, 256, 64), (256, 128, 256), (256, 256, 128), (512, 512, 64),
                     (512, 64, 512), (100, 1000, 20), (64, 700, 40)]


def k_slice(n: int, k: int, weight: bool) -> int:
    """kernels/forward_types.h's forward_k_slice."""
    if weight:
        return 256
    width, s = 128, 128
    if n >= k:
        while s // 2 >= k:
            width, s = width * 2, s // 2
    else:
        while width > 16 and width // 2 >= n:
            s, width = s * 2, width // 2
    return s


def sliced(blas, a: np.ndarray, b: np.ndarray, step: int) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    c = np.zeros((m, n), np.float32)
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)
        x, y = np.ascontiguousarray(a[:, k0:k1]), np.ascontiguousarray(b[k0:k1])
        blas.cblas_sgemm(101, 111, 111, m, n, k1 - k0, ctypes.c_float(1.0), x.ctypes.data_as(ctypes.c_void_p),
                         k1 - k0, y.ctypes.data_as(ctypes.c_void_p), n, ctypes.c_float(1.0 if k0 else 0.0),
                         c.ctypes.data_as(ctypes.c_void_p), n)
    return c


def ort_matmul(a: np.ndarray, b: np.ndarray, constant_b: bool) -> np.ndarray:
    (m, k), n = a.shape, b.shape[1]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])]
    if not constant_b:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n]))
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "g", inputs,
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(b, "b")] if constant_b else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"a": a} if constant_b else {"a": a, "b": b}
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blas", default="/lib/x86_64-linux-gnu/libopenblas.so.0")
    blas = ctypes.CDLL(ap.parse_args().blas)
    blas.openblas_set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}; fraction of outputs that differ, by K slice")
    for weight, shapes in ((True, WEIGHT_SHAPES), (False, ACTIVATION_SHAPES)):
        for m, k, n in shapes:
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
            want = ort_matmul(a, b, weight)
            row = {s: float(np.mean(sliced(blas, a, b, s) != want)) for s in (64, 128, 256, 512, 1024)}
            pick = k_slice(n, k, weight)
            print(f"{'weight' if weight else 'activations'} M={m} K={k} N={n}: picked {pick}: "
                  f"{float(np.mean(sliced(blas, a, b, pick) != want)):.4f}; "
                  + " ".join(f"{s}: {v:.4f}" for s, v in row.items()))


if __name__ == "__main__":
    main()

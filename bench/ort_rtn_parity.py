#!/usr/bin/env python3
"""Compares two MatMulNBits models weight by weight: nibble's against ONNX Runtime's quantizer's.

    .venv/bin/python bench/ort_rtn_parity.py NIBBLE.onnx ORT.onnx

For every MatMulNBits weight (matched by its initializer's name): the first K 4-bit codes of every column,
the scales (an all-zero block aside: nibble writes its smallest scale where ONNX Runtime writes 0), the zero
points when there are any, and the K / N / bits / block_size attributes. The slots past K in a partial last
block, and a zero-point row's unused last nibble, are reported apart: nibble fills the codes' slots with the
block's zero code (they dequantize to 0) and leaves the nibble 0; ONNX Runtime leaves zero code bytes and
writes 8 in that nibble. The K attribute bounds what the runtime reads. Exit status 1 when a weight differs.
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def matmulnbits(path: str) -> dict:
    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        arrays = [numpy_helper.to_array(inits[i]) if i in inits else None for i in n.input[1:]]
        out[n.input[1]] = (arrays, {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
    return out


def codes(packed: np.ndarray, K: int) -> np.ndarray:
    flat = packed.reshape(packed.shape[0], -1)
    out = np.empty((flat.shape[0], flat.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = flat & 0x0F, flat >> 4
    return out[:, :K]


def main() -> int:
    a, b = matmulnbits(sys.argv[1]), matmulnbits(sys.argv[2])
    same = padding = 0
    for name, (arr, attrs) in a.items():
        brr, battrs = b[name]
        K = attrs["K"]
        ok = attrs == battrs and np.array_equal(codes(arr[0], K), codes(brr[0], K))
        s, t = arr[1].reshape(-1), brr[1].reshape(-1)
        zero = t == 0
        ok &= np.array_equal(s[~zero].view(np.uint8), t[~zero].view(np.uint8)) and bool(np.all(s[zero] == s.dtype.type(1e-5)))
        ok &= (len(arr) > 2 and arr[2] is not None) == (len(brr) > 2 and brr[2] is not None)
        if len(arr) > 2 and arr[2] is not None:
            G = arr[1].reshape(arr[1].shape[0], -1).shape[1]
            ok &= np.array_equal(codes(arr[2], G), codes(brr[2], G))
        padding += int(not all(np.array_equal(x, y) for x, y in zip(arr, brr) if x is not None))
        same += ok
        if not ok:
            print("differs:", name)
    print(f"{same} of {len(a)} MatMulNBits weights: equal codes, scales and zero points "
          f"({padding} differ elsewhere only: padding past K, or an all-zero block's scale)")
    return 0 if same == len(a) == len(b) else 1


if __name__ == "__main__":
    sys.exit(main())

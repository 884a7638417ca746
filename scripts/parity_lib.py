#!/usr/bin/env python3
"""The body of scripts/parity: models, calibration npz, ModelOpt and nibble runs, comparison."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.e2e.conftest import Graph  # noqa: E402

NIBBLE = os.path.join(ROOT, "build", "nibble")
MODELOPT_PY = os.path.join(ROOT, ".venv-modelopt", "bin", "python")
CASES = {  # name: (ModelOpt run_modelopt.py flags, nibble flags)
    "rtn_dq": (["--algo", "rtn_dq"], ["--algo", "rtn_dq", "--awq_mode", "modelopt"]),
    "awq_lite": (["--algo", "awq_lite"], ["--algo", "awq_lite", "--awq_mode", "modelopt"]),
    "awq_clip": (["--algo", "awq_clip"], ["--algo", "awq_clip", "--awq_mode", "modelopt"]),
    "mixed_rtn_dq": (["--algo", "rtn_dq", "--enable_mixed_quant"],
                     ["--algo", "rtn_dq", "--enable_mixed_quant", "--awq_mode", "modelopt"]),
}
SAMPLES, SEQ = 8, 64


def run(cmd: list[str], log: str) -> float:
    t = time.time()
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        with open(log) as f:
            tail = f.read()[-2000:]
        sys.exit(f"parity: failed ({p.returncode}): {' '.join(cmd)}\n{tail}")
    return time.time() - t


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    if a.dtype == np.float16:
        ia, ib = a.view(np.int16).astype(np.int64), b.view(np.int16).astype(np.int64)
        ia, ib = np.where(ia < 0, -(ia & 0x7FFF), ia), np.where(ib < 0, -(ib & 0x7FFF), ib)
    else:
        ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
        ia, ib = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia), np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max()) if ia.size else 0


def codes(g: Graph, name: str) -> np.ndarray:
    from onnx import TensorProto
    if g.inits[name].data_type in (TensorProto.INT8, TensorProto.UINT8):   # mixed precision's 8-bit layers
        return g.array(name)
    return g.int4(name)[0]


def compare(a_path: str, b_path: str) -> tuple[int, int, int, int, list[str]]:
    """(weights, codes differing, codes total, max scale ulps, weights whose codes differ)."""
    a, b = Graph(a_path), Graph(b_path)
    wa = sorted(n for n in a.inits if n.endswith("_i4"))
    wb = sorted(n for n in b.inits if n.endswith("_i4"))
    if wa != wb:
        sys.exit(f"parity: different quantized weights: {wa} vs {wb}")
    diff = total = worst = 0
    bad = []
    for n in wa:
        qa, qb = codes(a, n), codes(b, n)
        d = int((qa != qb).sum())
        diff, total = diff + d, total + qa.size
        if d:
            bad.append(f"{n} ({d})")
        s = n[:-3] + "_scale"
        worst = max(worst, ulps(a.array(s), b.array(s)))
    return len(wa), diff, total, worst, bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    failed = []
    for dtype in ("fp32", "fp16"):
        if a.only and a.only != dtype:
            continue
        model = os.path.join(a.work, dtype, "model.onnx")
        if not os.path.exists(model):
            run([sys.executable, os.path.join(ROOT, "tools", "make_llama_shaped.py"), "--out", model, "--hidden", "256",
                 "--intermediate", "768", "--layers", "2", "--vocab", "1024", "--heads", "4", "--dtype", dtype,
                 "--seed", "5", "--quiet"], os.path.join(a.work, f"make_{dtype}.log"))
        npz = os.path.join(a.work, "calib.npz")
        rng = np.random.default_rng(17)
        import onnx
        names = {i.name for i in onnx.load(model, load_external_data=False).graph.input}
        arrays = {"input_ids": rng.integers(0, 1024, (SAMPLES, SEQ)).astype(np.int64),
                  "attention_mask": np.ones((SAMPLES, SEQ), np.int64)}
        np.savez(npz, **{k: v for k, v in arrays.items() if k in names})
        for case, (mo_flags, nb_flags) in CASES.items():
            d = os.path.join(a.work, dtype, case)
            mo, nb = os.path.join(d, "modelopt", "model.onnx"), os.path.join(d, "nibble", "model.onnx")
            os.makedirs(os.path.dirname(mo), exist_ok=True)
            calib = "awq" in case
            tm = run([MODELOPT_PY, os.path.join(ROOT, "bench", "run_modelopt.py"), "--onnx_path", model, "--output_path",
                      mo, "--block_size", "128", "--size_threshold", "1024", *mo_flags,
                      *(["--calib_npz", npz] if calib else [])], os.path.join(d, "modelopt.log"))
            tn = run([NIBBLE, "quantize", "--onnx_path", model, "--output_path", nb, "--block_size", "128", "--force",
                      *nb_flags, *(["--calib_data", npz, "--calib_size", str(SAMPLES)] if calib else [])],
                     os.path.join(d, "nibble.log"))
            w, diff, total, worst, bad = compare(mo, nb)
            exact = diff == 0 and worst <= 1
            print(f"parity: {dtype} {case}: {w} weights, {diff} of {total} codes differ, scales within {worst} ulp "
                  f"(ModelOpt {tm:.1f} s, nibble {tn:.1f} s){'' if exact else ': ' + ', '.join(bad[:4])}")
            if dtype == "fp32" and not exact:
                failed.append(f"{dtype} {case}")
    if failed:
        print(f"parity: FAILED (fp32 must match exactly): {', '.join(failed)}")
        return 1
    print("parity: fp32 identical to ModelOpt (fp16 differences, if any, listed above: ModelOpt computes fp16 "
          "models in fp16 numpy arithmetic)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

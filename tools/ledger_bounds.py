#!/usr/bin/env python3
"""The transfer ledger's acceptance bounds, for a run's report (summary.device) against its model:

- W: the bytes of the quantized weights as stored (the report's bytes_in);
- statistics: each activation's Gram matrix XᵀX once as K x K float32 (the calibration accumulates it in
  float32, so float32 carries its float64 file exactly); GPTQ's factor reads it as float64 (twice that),
  and awq_gptq's AWQ search once more as float32; awq_clip reads only its diagonal blocks
  [ceil(K/B), B, B] float32. K of each activation from the weights that read it;
- the packed output: the quantized tensors written (bytes_quantized_out).

With the layer engine (summary.calibration_engine.engine "native") the statistics build up on the device:
what goes up instead is its forward's input. Where the forward runs on the device (forward_on_device), the
activations it takes from the host once (activation_upload_bytes: the graph's inputs, embedding rows),
its weights being the search's; where it runs on the host, each activation's counted rows once
(statistics_row_bytes, float32). awq_learned's rounding reads the Gram where it accumulated; the
searches' O(K) vectors (candidate scales, energies: up to 64 K-vectors of float32 per activation) on top of
the 10%, since no Gram's bulk hides them on a small model; down, each activation's Σ|x| (K float64).

Up:   rtn_dq, rtn, hqq: W · 1.1 (MatMulNBits too: the packings read the codes where the quantizer left
      them);  the calibrated algorithms: (W + statistics) · 1.1.
Down: the packed output · 1.1, + 1% for the choices the host sees (alphas' losses, weight statistics).
On the host: O(K) vector operations only (awq_scale).

tests/e2e/test_ledger.py asserts these on the emulated device; bench/gpu_check prints them for a GPU's
reports:   tools/ledger_bounds.py --model MODEL.onnx --report REPORT.json --algo ALGO [--block_size 128]
"""
from __future__ import annotations

import argparse
import json
import sys

HOST_OK = {"awq_scale"}  # K values per candidate scale: libm's powf, O(K) on the host


def activations(model_path: str, report: dict) -> dict[str, int]:
    """Every activation a quantized weight reads (its MatMul's other input) and its K."""
    import onnx
    k_of = {w["name"]: w["shape"][w["k_axis"]] for w in report["weights"] if w["op_type"] in ("MatMul", "Gemm")}
    g = onnx.load(model_path, load_external_data=False).graph
    acts = {}
    for n in g.node:
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in k_of:
            acts[n.input[0]] = k_of[n.input[1]]
    if not acts:
        raise ValueError("no quantized MatMul found")
    return acts


def gram_bytes(acts: dict[str, int]) -> int:
    return sum(K * K * 4 for K in acts.values())


def gram_block_bytes(acts: dict[str, int], B: int) -> int:
    return sum(-(-K // B) * B * B * 4 for K in acts.values())


def statistics_bytes(algo: str, acts: dict[str, int], block: int) -> int:
    """What the algorithm's statistics weigh on the bus, each once."""
    g32 = gram_bytes(acts)
    return {"rtn_dq": 0, "rtn": 0, "hqq": 0, "awq_clip": gram_block_bytes(acts, block), "gptq": 2 * g32,
            "awq_gptq": 3 * g32}.get(algo, g32)


def check(model_path: str, report: dict, algo: str, block: int = 128) -> list[str]:
    """The bounds this report breaks (empty when it meets them all), each as one line."""
    s, d = report["summary"], report["summary"]["device"]
    w = s["bytes_in"]
    acts = activations(model_path, report) if algo not in ("rtn_dq", "rtn", "hqq") else {}
    engine = s.get("calibration_engine", {})
    vectors = down_vectors = 0
    if engine.get("engine") == "native":
        rows = engine["activation_upload_bytes"] if engine.get("forward_on_device") else engine["statistics_row_bytes"]
        # awq_learned's rounding reads the Gram where the statistics are (before, a host copy went up again)
        stats = rows
        vectors, down_vectors = 64 * 4 * sum(acts.values()), 8 * sum(acts.values())
    else:
        stats = statistics_bytes(algo, acts, block)
    packed = s["bytes_quantized_out"]
    broken = []
    up = 1.1 * (w + stats) + vectors
    if not w <= d["h2d_bytes"] <= up:
        broken.append(f"h2d {d['h2d_bytes']} outside [W {w}, "
                      f"1.1 x (W + statistics {stats}) + vectors {vectors} = {up:.0f}]")
    if d["d2h_bytes"] > 1.11 * packed + down_vectors:
        broken.append(f"d2h {d['d2h_bytes']} > 1.11 x packed output {packed} + Σ|x| {down_vectors}")
    if not set(d["on_host"]) <= HOST_OK:
        broken.append(f"on the host: {sorted(set(d['on_host']) - HOST_OK)}")
    return broken


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--algo", required=True)
    ap.add_argument("--block_size", type=int, default=128)
    a = ap.parse_args()
    with open(a.report) as f:
        r = json.load(f)
    s, d = r["summary"], r["summary"]["device"]
    w = s["bytes_in"]
    broken = check(a.model, r, a.algo, a.block_size)
    print(f"{a.algo:<9} h2d {d['h2d_bytes'] / w:.3f} W, d2h {d['d2h_bytes'] / s['bytes_quantized_out']:.3f} x packed, "
          f"allocations {d['allocations']}, on host {sorted(d['on_host'])}: "
          + ("within the bounds" if not broken else "OUTSIDE: " + "; ".join(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

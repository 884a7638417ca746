#!/usr/bin/env python3
"""What a run would cost on a GPU, from its transfer ledger (a --report of a --device cuda_emulated or
cuda run: summary.device). The ledger counts exactly what crosses the bus, the launches and the
arithmetic each operation implies; this script puts them on a roofline of an RTX 4090 and an H100.

    bench/gpu_model.py REPORT.json [REPORT.json ...] [--markdown]

(bench/gpu runs nibble on a device and prints this for each of its runs.)

Per operation: bytes up and down, launches, fp32 and fp64 flops, and the projected time on each card:
  transfer = (h2d + d2h) / PCIe bandwidth  (synchronous copies today: nothing overlaps them)
  compute  = max(fp32 flops / fp32 peak, fp64 flops / fp64 peak) + launches x 5 us
and for the whole run the time with copies serialized (today) and fully overlapped (the bound once
uploads run beside compute). Operations that ran on the host (host_fallback) are listed but not
projected: their time is the CPU's. The flops are a model's count from the shapes (kernels/cuda:
count_flops), not measured; the bytes are exact.
"""
from __future__ import annotations

import json
import sys

# Sustained figures assumed for the projection (what the cards reach in practice, below the datasheets).
CARDS = {
    # RTX 4090: PCIe 4.0 x16 (32 GB/s raw, ~25 sustained), 1.0 TB/s GDDR6X, 82 TFLOPS fp32, 1.3 fp64.
    "RTX 4090": {"pcie": 25e9, "fp32": 82e12, "fp64": 1.3e12},
    # H100 SXM on PCIe 5.0 x16 (64 GB/s raw, ~50 sustained), 3.3 TB/s HBM3, 67 TFLOPS fp32, 34 fp64.
    "H100": {"pcie": 50e9, "fp32": 67e12, "fp64": 34e12},
}
LAUNCH_S = 5e-6


def project(op: dict, card: dict) -> tuple[float, float]:
    transfer = (op["h2d_bytes"] + op["d2h_bytes"]) / card["pcie"]
    compute = max(op.get("flops", 0) / card["fp32"], op.get("flops_fp64", 0) / card["fp64"]) + op["launches"] * LAUNCH_S
    return transfer, compute


def human(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1000 or unit == "TB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1000
    return str(b)


def report(path: str, markdown: bool) -> None:
    with open(path) as f:
        r = json.load(f)
    s = r["summary"]
    d = s.get("device")
    if not d:
        print(f"{path}: no summary.device (a CPU run has no ledger)")
        return
    o = r["options"]
    print(f"\n{path}: algo {o['algo']}, {s['weights_quantized']} weights, {human(s['bytes_in'])} in -> "
          f"{human(s['bytes_quantized_out'])} out")
    print(f"  up {human(d['h2d_bytes'])} ({d['h2d_bytes'] / s['bytes_in']:.3f}x the weights), down "
          f"{human(d['d2h_bytes'])} ({d['d2h_bytes'] / s['bytes_quantized_out']:.3f}x the output), "
          f"{d['allocations']} allocations, {d['launches']} launches, on the host: {', '.join(d['on_host']) or 'nothing'}")
    cols = ["operation", "calls", "up", "down", "launches", "GFLOP fp32", "GFLOP fp64"] + \
           [f"{c} copy+compute ms" for c in CARDS]
    rows = []
    totals = {c: [0.0, 0.0] for c in CARDS}
    for name, op in sorted(d["ops"].items()):
        row = [name, str(op["calls"]), human(op["h2d_bytes"]), human(op["d2h_bytes"]), str(op["launches"]),
               f"{op.get('flops', 0) / 1e9:.1f}", f"{op.get('flops_fp64', 0) / 1e9:.1f}"]
        for c, card in CARDS.items():
            if op["host_fallback"]:
                row.append("host")
                continue
            t, k = project(op, card)
            totals[c][0] += t
            totals[c][1] += k
            row.append(f"{t * 1e3:.1f} + {k * 1e3:.1f}")
        rows.append(row)
    if markdown:
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(x[i]) for x in rows + [cols]) for i in range(len(cols))]
        for row in [cols] + rows:
            print("  " + "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    for c, (t, k) in totals.items():
        print(f"  {c}: device part {1e3 * (t + k):.0f} ms with copies serialized (today), "
              f"{1e3 * max(t, k):.0f} ms overlapped; of which copies {1e3 * t:.0f} ms, compute {1e3 * k:.0f} ms")


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    paths = [a for a in argv if a != "--markdown"]
    if not paths:
        print(__doc__.strip())
        return 2
    for p in paths:
        report(p, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

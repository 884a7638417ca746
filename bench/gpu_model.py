#!/usr/bin/env python3
"""What a run would cost on a GPU, from its transfer ledger (a --report of a --device cuda_emulated or
cuda run: summary.device). The ledger counts exactly what crosses the bus, the launches and the
arithmetic each operation implies; this script puts them on a roofline of an RTX 4090 and an H100.

    bench/gpu_model.py REPORT.json [REPORT.json ...] [--markdown]

(bench/gpu runs nibble on a device and prints this for each of its runs.)

Per operation: bytes up and down, launches, fp32 and fp64 flops, and the projected time on each card:
  transfer = (h2d + d2h) / PCIe bandwidth  (synchronous copies today: nothing overlaps them)
  compute  = max(fp32 flops / fp32 peak, fp64 flops / fp64 peak) + launches x 5 us
and for the whole run three times:
  - serialized: every copy and every operation one after the other (one stream, synchronous copies: the
    CUDA backend before its copies went through pinned staging and streams);
  - as built: the structure of kernels/cuda/device.h. The prefetches that the ledger counts as overlapped
    (Backend::keep of the next weight, on the prefetch stream, launches issued while it was in flight:
    `prefetch_bytes_overlapped`) run beside everything else; the operations' own copies stay in series
    with their compute (the copy stream waits for the compute stream and back). PCIe is full duplex and
    the prefetch stream has its own copy engine, so: max(prefetched / PCIe, the rest in series). Summed
    over the run, not weight by weight: a bound that assumes the prefetches are spread like the compute;
  - fully overlapped: max(all uploads, all downloads, all compute) (PCIe full duplex), the bound of any
    structure.
A copy through staging is also bounded by the host's memcpy into the pinned buffer (chunk i + 1 is filled
while chunk i is in flight); one thread's memcpy from the page cache runs ~10 GB/s (HOST_COPY), below
an H100's PCIe 5.0: the line "staging fill" says what that bound would be for the staged bytes.
Operations that ran on the host (host_fallback) are listed but not projected: their time is the CPU's.
The flops are a model's count from the shapes (kernels/cuda: count_flops), not measured; the bytes are
exact.
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
# One host thread's memcpy from the page cache into pinned staging (the figure GPU-MODEL.md uses for RTN).
HOST_COPY = 10e9


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
    one_way = {c: [0.0, 0.0] for c in CARDS}  # projected ops' bytes up and down, in seconds
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
            one_way[c][0] += op["h2d_bytes"] / card["pcie"]
            one_way[c][1] += op["d2h_bytes"] / card["pcie"]
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
    prefetched = d.get("prefetch_bytes_overlapped", 0)
    print(f"  prefetches {d.get('prefetches', 0)} ({d.get('prefetches_overlapped', 0)} overlapped, "
          f"{human(prefetched)}), through staging {human(d.get('staged_bytes', 0))} in "
          f"{d.get('staging_chunks', 0)} chunks")
    for c, (t, k) in totals.items():
        p = prefetched / CARDS[c]["pcie"]
        built = max(p, t + k - p)
        bound = max(one_way[c][0], one_way[c][1], k)
        print(f"  {c}: device part {1e3 * (t + k):.0f} ms with copies serialized, {1e3 * built:.0f} ms as built "
              f"(prefetch stream {1e3 * p:.0f} ms beside {1e3 * (t + k - p):.0f} ms in series), "
              f"{1e3 * bound:.0f} ms fully overlapped; of which copies {1e3 * t:.0f} ms, compute {1e3 * k:.0f} ms")
    fill = d.get("staged_bytes", 0) / HOST_COPY
    print(f"  staging fill: {human(d.get('staged_bytes', 0))} at {HOST_COPY / 1e9:.0f} GB/s (one host thread's "
          f"memcpy) takes {1e3 * fill:.0f} ms, a floor on the copies of either card when it exceeds their PCIe time")


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

#!/usr/bin/env python3
"""The table scripts/demo prints: for each model folder (float first), the perplexity, KL and top-1
agreement of its eval.json (`nibble eval --json`), its size on disk, its quantization time
(seconds.txt) and its greedy sample (sample.txt, tools/eval_ppl.py's [sample] line).

    tools/demo_table.py build/smollm2-fp32 build/smollm2-rtn build/smollm2-default
"""
from __future__ import annotations

import json
import os
import sys

LABELS = {"smollm2-fp32": "float (fp32)", "smollm2-rtn": "INT4 RTN (rtn_dq)", "smollm2-default": "INT4 default (awq_lite)"}


def read(path: str, default: str = "") -> str:
    return open(path).read().strip() if os.path.exists(path) else default


def row(folder: str) -> list[str]:
    ev = json.loads(read(os.path.join(folder, "eval.json"), "{}"))
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith("model.onnx"))
    kl = f"{ev['kl']:.4f}" if "kl" in ev else "-"
    agree = f"{100 * ev['top1_agreement']:.1f} %" if "top1_agreement" in ev else "-"
    secs = read(os.path.join(folder, "seconds.txt"))
    return [LABELS.get(os.path.basename(folder.rstrip("/")), folder), f"{ev.get('ppl', float('nan')):.2f}", kl, agree,
            f"{size / 1e6:.1f} MB", f"{secs} s" if secs else "-"]


def main(folders: list[str]) -> None:
    head = ["model", "perplexity", "KL vs float", "top-1 agree", "size", "quantize time"]
    rows = [head] + [row(f) for f in folders]
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for i, r in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in width) + "|")
    print()
    for f in folders:
        print(f"{LABELS.get(os.path.basename(f.rstrip('/')), f)}: {read(os.path.join(f, 'sample.txt'))[len('[sample] '):]}")


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Paired perplexity comparison of two quantized models evaluated on the same windows.

Two models' perplexities a few tenths of a percent apart on one text say little by themselves: with
other text the order may flip. Both models see the same windows, so the per-window difference of mean
NLL (tools/eval_ppl.py's "window_nll") has a standard error that says how sure the order is:

    .venv/bin/python tools/eval_ppl.py A/model.onnx --windows 128 --tokenizer T > a.json
    .venv/bin/python tools/eval_ppl.py B/model.onnx --windows 128 --tokenizer T > b.json
    python3 bench/paired_ppl.py a.json b.json [--names A B]

prints each perplexity, the ratio B/A, and mean(nll_B - nll_A) per window with its standard error and
t = mean / se (|t| < 2: the order is within what other text could reverse).

A side may be several evaluations joined by '+' (e.g. the eval and the calib split of a method that reads
no calibration data: `a_eval.json+a_calib.json`): their windows are pooled, in order, and paired with the
other side's, which must cover the same splits in the same order.
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def load(spec: str) -> dict:
    """One evaluation, or several joined by '+' pooled into one (windows in order)."""
    parts = [load_one(p) for p in spec.split("+")]
    if len(parts) == 1:
        return parts[0]
    if len({p.get("seq_len") for p in parts}) != 1:
        raise SystemExit(f"paired_ppl: {spec}: the evaluations have different --seq_len")
    w = [v for p in parts for v in p["window_nll"]]
    return {"ppl": math.exp(sum(w) / len(w)), "window_nll": w, "seq_len": parts[0].get("seq_len"),
            "split": "+".join(str(p.get("split", "eval")) for p in parts)}


def load_one(path: str) -> dict:
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
    if not lines:
        raise SystemExit(f"paired_ppl: {path}: no JSON line (tools/eval_ppl.py's output)")
    r = json.loads(lines[-1])
    if "window_nll" not in r:
        raise SystemExit(f"paired_ppl: {path}: no window_nll (evaluated by an older tools/eval_ppl.py)")
    return r


def compare(a: dict, b: dict) -> dict:
    wa, wb = a["window_nll"], b["window_nll"]
    if (len(wa) != len(wb) or a.get("seq_len") != b.get("seq_len")
            or a.get("split", "eval") != b.get("split", "eval")):
        raise SystemExit("paired_ppl: the two evaluations cover different windows")
    d = [y - x for x, y in zip(wa, wb)]
    n = len(d)
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / (n - 1) if n > 1 else float("nan")
    se = math.sqrt(var / n) if n > 1 else float("nan")
    return {"windows": n, "ppl_a": a["ppl"], "ppl_b": b["ppl"], "ratio": b["ppl"] / a["ppl"],
            "mean_dnll": mean, "se": se, "t": mean / se if se > 0 else None,  # None: no spread (identical)
            "b_better_windows": sum(v < 0 for v in d), "identical": all(v == 0 for v in d)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--names", nargs=2, default=["A", "B"])
    args = ap.parse_args(argv)
    r = compare(load(args.a), load(args.b))
    na, nb = args.names
    print(f"{na}: ppl {r['ppl_a']:.4f}   {nb}: ppl {r['ppl_b']:.4f}   {nb}/{na} {r['ratio']:.5f}")
    if r["identical"]:
        print(f"{r['windows']} windows: the same NLL on every window")
    else:
        t = "undefined" if r["t"] is None else f"{r['t']:+.2f}"
        print(f"{r['windows']} windows: mean nll({nb}) - nll({na}) = {r['mean_dnll']:+.6f} "
              f"(se {r['se']:.6f}, t {t}); {nb} lower on {r['b_better_windows']} windows")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

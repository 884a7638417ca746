#!/usr/bin/env python3
"""Calibration-free INT4 side by side: nibble's rtn_dq (least-squares scale search), rtn_dq
--use_zero_point and hqq against ONNX Runtime's MatMulNBitsQuantizer RTN (symmetric, asymmetric) and HQQ.

    python3 bench/search_side_by_side.py MODEL.onnx --work DIR [--block_size 128] [--windows 8]
        [--rows nibble_rtn,nibble_rtn_zp,nibble_hqq,nibble_hqq_dq,ort_sym,ort_asym,ort_hqq] [--json FILE]

Each row quantizes (measured by bench/measure.py: wall s, peak RSS of the process tree), one after the
other, into DIR/<row>/, then `nibble eval --model OUT --reference MODEL --windows W` gives perplexity,
KL(float || quantized) and top-1 agreement. lm_head stays float everywhere (nibble's default; ORT's
quantizer is given the node through run_ort_quantizer.py's default --exclude /lm_head). Prints a markdown
table.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from measure import measure  # noqa: E402

NIBBLE = os.path.join(ROOT, "build", "nibble")
ORT_PY = os.path.join(ROOT, ".venv-ortq", "bin", "python")
ROWS = {
    "nibble_rtn": ("nibble", "rtn_dq (new default: 16-level least-squares scale search)", ["--algo", "rtn_dq"]),
    "nibble_rtn_zp": ("nibble", "rtn_dq --use_zero_point", ["--algo", "rtn_dq", "--use_zero_point"]),
    "nibble_hqq": ("nibble", "hqq --format matmulnbits (float zero points)", ["--algo", "hqq", "--format", "matmulnbits"]),
    "nibble_hqq_dq": ("nibble", "hqq (dq: integer zero points)", ["--algo", "hqq"]),
    "ort_sym": ("ORT 1.24", "RTN symmetric (MatMulNBits)", ["--symmetric"]),
    "ort_asym": ("ORT 1.24", "RTN asymmetric (MatMulNBits)", []),
    "ort_hqq": ("ORT 1.24", "HQQ (MatMulNBits, float zero points)", ["--algo", "hqq"]),
}


def command(row, model, out, bs):
    tool, _, flags = ROWS[row]
    if tool == "nibble":
        return [NIBBLE, "quantize", "--onnx_path", model, "--output_path", out, "--block_size", str(bs), "--force",
                "--quiet", *flags]
    return [ORT_PY, os.path.join(HERE, "run_ort_quantizer.py"), "--onnx_path", model, "--output_path", out,
            "--block_size", str(bs), *flags]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--work", required=True)
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    for row in args.rows.split(","):
        d = os.path.join(args.work, row)
        out = os.path.join(d, "model.onnx")
        os.makedirs(d, exist_ok=True)
        m = measure(command(row, args.model, out, args.block_size), outputs=[d], log_path=os.path.join(d, "log.txt"))
        rec = {"row": row, "tool": ROWS[row][0], "what": ROWS[row][1], "wall_s": m["wall_s"],
               "peak_rss_mb": m.get("peak_rss_mb", 0), "rc": m["rc"]}
        if m["rc"] == 0:
            ej = os.path.join(d, "eval.json")
            # ORT's quantizer writes no tokenizer beside its output: the float model's.
            subprocess.run([NIBBLE, "eval", "--model", out, "--reference", args.model, "--windows", str(args.windows),
                            "--tokenizer", os.path.dirname(os.path.abspath(args.model)), "--json", ej, "--quiet"],
                           check=True)
            with open(ej) as f:
                rec["eval"] = json.load(f)
        results.append(rec)
        print(json.dumps(rec), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("| tool | algo | wall s | peak RSS MB | ppl | KL | top-1 |\n|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        e = r.get("eval", {})
        print(f"| {r['tool']} | {r['what']} | {r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} | "
              f"{e.get('ppl', float('nan')):.3f} | {e.get('kl', float('nan')):.4f} | "
              f"{100 * e.get('top1_agreement', float('nan')):.1f}% |")


if __name__ == "__main__":
    main()

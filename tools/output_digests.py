#!/usr/bin/env python3
"""Quantizes one model with every algorithm and mode and prints a SHA-256 of each output (graph and
data), so that two builds can be compared byte for byte (a refactoring must not change a single
output byte). Calibration statistics are cached per run in --cache, so a second build reuses them.

    tools/output_digests.py --nibble build/nibble --model M/model.onnx --calib_data calib.npz \
        --out /tmp/digests --cache /tmp/calib-cache --json digests.json
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

RUNS = {
    "rtn_dq": ["--algo", "rtn_dq"],
    "rtn_dq_zp_mnb": ["--algo", "rtn_dq", "--use_zero_point", "--format", "matmulnbits"],
    "rtn_qdq": ["--algo", "rtn"],
    "rtn_dq_mixed_modelopt": ["--algo", "rtn_dq", "--layers_8bit", "mlp/down_proj"],
    "rtn_lsq": ["--algo", "rtn_lsq"],
    "rtn_lsq_qdq": ["--algo", "rtn_lsq", "--format", "qdq"],
    "rtn_lsq_mixed": ["--algo", "rtn_lsq", "--layers_8bit", "mlp/down_proj"],
    "awq_lite": ["--algo", "awq_lite"],
    "awq_lite_modelopt": ["--algo", "awq_lite", "--awq_mode", "modelopt"],
    "awq_clip": ["--algo", "awq_clip"],
    "awq_clip_zp": ["--algo", "awq_clip", "--use_zero_point"],
    "awq_clip_modelopt": ["--algo", "awq_clip", "--awq_mode", "modelopt"],
    "awq_full": ["--algo", "awq_full"],
    "awq_full_modelopt": ["--algo", "awq_full", "--awq_mode", "modelopt"],
    "mixed_sensitivity_awq": ["--algo", "awq_lite", "--mixed_strategy", "sensitivity"],
    "mixed_sensitivity_rtn": ["--algo", "rtn_dq", "--mixed_strategy", "sensitivity", "--use_zero_point"],
    "gptq": ["--algo", "gptq"],
    "gptq_zp_act": ["--algo", "gptq", "--use_zero_point", "--gptq_act_order"],
    "awq_gptq": ["--algo", "awq_gptq"],
    "gptq_zp_mnb": ["--algo", "gptq", "--use_zero_point", "--format", "matmulnbits"],
    "awq_gptq_mnb": ["--algo", "awq_gptq", "--format", "matmulnbits"],
    "awq_learned": ["--algo", "awq_learned"],
    "hqq": ["--algo", "hqq"],
    "hqq_mnb": ["--algo", "hqq", "--format", "matmulnbits"],
}


def sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nibble", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib_data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--json")
    ap.add_argument("--only", default="", help="comma-separated run names")
    ap.add_argument("--extra", default="", help="more flags for every run, e.g. '--device cuda_emulated'")
    ap.add_argument("--reports", default="", help="folder for each run's --report (NAME.json)")
    a = ap.parse_args()
    runs = {k: v for k, v in RUNS.items() if not a.only or k in a.only.split(",")}
    result = {}
    for name, args in runs.items():
        out = os.path.join(a.out, name, "model.onnx")
        cmd = [a.nibble, "quantize", "--onnx_path", a.model, "--output_path", out, "--force", "--quiet",
               "--calib_data", a.calib_data, "--calib_size", "8", "--calib_seq_len", "128",
               "--calib_cache", os.path.join(a.cache, name)] + args + a.extra.split()
        if a.reports:
            cmd += ["--report", os.path.join(a.reports, name + ".json")]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            result[name] = {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else str(p.returncode)}
        else:
            import onnx
            m = onnx.load(out, load_external_data=False)  # the data file is OUT.<hash of its content>.data
            loc = next(e.value for t in m.graph.initializer for e in t.external_data if e.key == "location")
            result[name] = {"graph": sha(out), "data": sha(os.path.join(os.path.dirname(out), loc))}
        print(name, json.dumps(result[name]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

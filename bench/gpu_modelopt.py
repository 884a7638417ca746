#!/usr/bin/env python3
"""ModelOpt 0.47 beside nibble on one machine: each algorithm run by both on the same model and
calibration npz, with the wall time and peak RSS of each process (os.wait4), nibble's transfer ledger
from its report, and ModelOpt-mode parity (nibble --awq_mode modelopt against ModelOpt's output: the
bytes of the packed INT4 codes and of the scales that differ). bench/gpu_check runs it (step
`modelopt`), with ModelOpt on CuPy where the image has it, or on the CPU in the dry run.

    python bench/gpu_modelopt.py --nibble build/nibble --modelopt_python VENV/bin/python \\
        --model M/model.onnx --calib_npz calib.npz --device cuda --work DIR --json out.json \\
        [--algos rtn_dq,awq_lite,awq_clip] [--calibration_eps cpu] [--timeout 900]

Needs numpy and onnx in the Python that runs it. Exit status 0 whenever the runs finished (differences
are reported, not failed: ModelOpt computes fp16 models in fp16 arithmetic); 1 when a run failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd: list[str], log: str, timeout: float) -> dict:
    """Runs cmd (output to log): {rc, seconds, peak_rss_mib} of that process and the children it waited for."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": p.returncode, "seconds": round(time.perf_counter() - t0, 3),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def initializer_bytes(path: str) -> dict[str, tuple[int, bytes]]:
    """name -> (data_type, bytes) of every initializer of a model, external data loaded."""
    import onnx
    m = onnx.load(path, load_external_data=True)
    out = {}
    for t in m.graph.initializer:
        if t.HasField("raw_data"):
            raw = t.raw_data
        elif t.int32_data:  # INT4/UINT4 and fp16 in int32_data hold one value (or packed byte) per entry
            width = np.uint16 if t.data_type in (10, 16) else np.uint8
            raw = np.array(t.int32_data, np.int32).astype(width).tobytes()
        else:
            raw = onnx.numpy_helper.to_array(t).tobytes()
        out[t.name] = (t.data_type, raw)
    return out


def ulps(a: bytes, b: bytes, data_type: int) -> int:
    """Largest distance in units in the last place between two float arrays' values."""
    if len(a) != len(b):
        return -1
    if data_type in (10, 16):  # fp16, bf16
        ia, ib = (np.frombuffer(x, np.int16).astype(np.int64) for x in (a, b))
        mask = 0x7FFF
    else:
        ia, ib = (np.frombuffer(x, np.int32).astype(np.int64) for x in (a, b))
        mask = 0x7FFFFFFF
    ia, ib = (np.where(v < 0, -(v & mask), v) for v in (ia, ib))
    return int(np.abs(ia - ib).max()) if ia.size else 0


def parity(modelopt_out: str, nibble_out: str) -> dict:
    """How far nibble's modelopt mode is from ModelOpt: packed code bytes and scales, weight by weight."""
    a, b = initializer_bytes(modelopt_out), initializer_bytes(nibble_out)
    codes = sorted(n for n in a if n.endswith("_i4"))
    if codes != sorted(n for n in b if n.endswith("_i4")):
        return {"error": "different quantized weights"}
    differ = total = scale_differ = scale_total = worst = 0
    weights_differ = []
    for n in codes:
        ca, cb = (np.frombuffer(x[n][1], np.uint8) for x in (a, b))
        d = int((ca != cb).sum()) if ca.size == cb.size else ca.size
        differ, total = differ + d, total + ca.size
        if d:
            weights_differ.append(n)
        s = n[:-3] + "_scale"
        sa, sb = a[s][1], b[s][1]
        scale_total += len(sa)
        scale_differ += int((np.frombuffer(sa, np.uint8) != np.frombuffer(sb, np.uint8)).sum()) if len(sa) == len(sb) \
            else len(sa)
        worst = max(worst, ulps(sa, sb, a[s][0]))
    return {"weights": len(codes), "code_bytes": total, "code_bytes_differ": differ,
            "scale_bytes": scale_total, "scale_bytes_differ": scale_differ, "scale_max_ulps": worst,
            "weights_differ": weights_differ}


def run_algo(a, algo: str) -> dict:
    d = os.path.join(a.work, algo)
    mo, nb = os.path.join(d, "modelopt", "model.onnx"), os.path.join(d, "nibble", "model.onnx")
    os.makedirs(os.path.dirname(mo), exist_ok=True)
    calib = algo != "rtn_dq"
    m = timed([a.modelopt_python, os.path.join(ROOT, "bench", "run_modelopt.py"), "--onnx_path", a.model,
               "--output_path", mo, "--algo", algo, "--block_size", "128", "--size_threshold", "1024",
               "--calibration_eps", a.calibration_eps, *(["--calib_npz", a.calib_npz] if calib else [])],
              os.path.join(d, "modelopt.log"), a.timeout)
    report = os.path.join(d, "nibble.json")
    n = timed([a.nibble, "quantize", "--onnx_path", a.model, "--output_path", nb, "--algo", algo, "--awq_mode",
               "modelopt", "--block_size", "128", "--device", a.device, "--calibration_eps", a.calibration_eps,
               "--force", "--quiet", "--report", report,
               *(["--calib_data", a.calib_npz, "--calib_size", str(a.calib_size)] if calib else [])],
              os.path.join(d, "nibble.log"), a.timeout)
    row = {"algo": algo, "modelopt": m, "nibble": n}
    if m["rc"] == 0 and n["rc"] == 0:
        row["parity"] = parity(mo, nb)
        s = json.load(open(report))["summary"]
        row["nibble"]["ledger"] = {k: s.get("device", {}).get(k) for k in ("h2d_bytes", "d2h_bytes", "launches",
                                                                          "uploads_in_flight")}
        row["nibble"]["read_gbps"] = s.get("read_gbps")
    return row


def line(r: dict) -> str:
    m, n = r["modelopt"], r["nibble"]
    if m["rc"] or n["rc"]:
        return f"{r['algo']:<9} failed: ModelOpt rc {m['rc']}, nibble rc {n['rc']} (logs in the work folder)"
    p, led = r["parity"], n.get("ledger", {})
    same = "" if "error" not in p else p["error"]
    if not same:
        same = (f"codes {p['code_bytes_differ']}/{p['code_bytes']} bytes differ "
                f"({100 * p['code_bytes_differ'] / max(p['code_bytes'], 1):.2f}%), scales "
                f"{p['scale_bytes_differ']}/{p['scale_bytes']} bytes (max {p['scale_max_ulps']} ulp)")
    return (f"{r['algo']:<9} ModelOpt {m['seconds']:7.1f} s {m['peak_rss_mib']:8.0f} MiB | nibble {n['seconds']:7.1f} s "
            f"{n['peak_rss_mib']:8.0f} MiB | time x{m['seconds'] / max(n['seconds'], 1e-9):.2f}, RSS "
            f"x{m['peak_rss_mib'] / max(n['peak_rss_mib'], 1e-9):.2f} | ledger up {(led.get('h2d_bytes') or 0) / 2**20:.0f}"
            f" MiB, down {(led.get('d2h_bytes') or 0) / 2**20:.0f} MiB | parity: {same}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nibble", required=True)
    ap.add_argument("--modelopt_python", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib_npz", required=True)
    ap.add_argument("--calib_size", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--calibration_eps", default="cpu")
    ap.add_argument("--algos", default="rtn_dq,awq_lite,awq_clip")
    ap.add_argument("--work", required=True)
    ap.add_argument("--json")
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    rows = []
    print("ratios are ModelOpt / nibble (above 1: nibble is faster or smaller); parity: nibble --awq_mode modelopt "
          "against ModelOpt's output", flush=True)
    for algo in a.algos.split(","):
        rows.append(run_algo(a, algo))
        print(line(rows[-1]), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"model": a.model, "device": a.device, "rows": rows}, f, indent=1)
    return 1 if any(r["modelopt"]["rc"] or r["nibble"]["rc"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

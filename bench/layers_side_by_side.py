#!/usr/bin/env python3
"""Whole-model pass against --layer_by_layer, side by side in one run: wall time, peak RSS of the
process tree (nibble + its calibration child) and peak temporary disk, per model.

    python3 bench/layers_side_by_side.py --model M.onnx [--model M2.onnx ...] --work DIR
        [--nibble build/nibble] [--json OUT.json] -- QUANTIZE_FLAGS...

Temporary disk = everything under a private TMPDIR given to the run (calibration statistics) plus the
layer state folder beside the output (boundary activations, checkpoint), sampled every 0.2 s.  The output
being written is not counted (whole-model: its hidden temporary beside the output; layer by layer:
output.data in the state folder, renamed into place at the end).
"""
import argparse
import json
import os
import shutil
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import MB, dir_size, measure  # noqa: E402


def _pid_writing(out):
    """The nibble process whose command line names `out` (this script started it)."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if out.encode() in args and b"quantize" in args:
                return int(d)
    return None


def run_one(nibble, model, work, tag, flags, until_search=False):
    out_dir = os.path.join(work, tag)
    tmp = os.path.join(work, tag + ".tmp")
    for d in (out_dir, tmp):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    out = os.path.join(out_dir, "model.onnx")
    state = os.path.join(out_dir, ".model.onnx.layers")
    peak, done = [0], threading.Event()
    log_path = os.path.join(work, tag + ".log")

    def poll():
        while not done.is_set():
            if until_search and os.path.exists(log_path):
                with open(log_path, errors="replace") as f:
                    started = "info awq [" in f.read()
                pid = _pid_writing(out) if started else None
                if pid:   # every statistic is on disk: the temporary-disk peak is past
                    os.killpg(pid, 9)
            _, files = dir_size([tmp, state])
            peak[0] = max(peak[0], sum(b for f, b in files if os.path.basename(f) != "output.data"))
            done.wait(0.2)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    env = dict(os.environ, TMPDIR=tmp)
    r = measure([nibble, "quantize", "--onnx_path", model, "--output_path", out, "--force", *flags],
                outputs=[out_dir], log_path=log_path, env=env)
    done.set()
    th.join()
    return {"tag": tag, "rc": r["rc"], "stopped_at_search": until_search, "wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"],
            "peak_temp_disk_mb": round(peak[0] / MB, 1), "output_mb": r["output_mb"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--nibble", default="build/nibble")
    ap.add_argument("--json")
    ap.add_argument("--modes", default="whole,layers")
    ap.add_argument("--until_search", action="store_true",
                    help="stop each run once the first AWQ search starts (calibration's disk and RSS peaks only)")
    ap.add_argument("flags", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    flags = [f for f in a.flags if f != "--"]
    rows = []
    for m in a.model:
        name = os.path.basename(os.path.dirname(os.path.abspath(m)))
        for mode in a.modes.split(","):
            extra = ["--layer_by_layer", "on" if mode == "layers" else "off"]
            r = run_one(a.nibble, m, a.work, f"{name}_{mode}", flags + extra, a.until_search)
            r["model"], r["mode"] = m, mode
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"flags": flags, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

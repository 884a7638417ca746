#!/usr/bin/env python3
"""RTN INT4 side by side: nibble vs ModelOpt rtn_dq vs ONNX Runtime's MatMulNBitsQuantizer.

    python3 bench/rtn_side_by_side.py MODEL.onnx [--work /tmp/rtn_sbs] [--block_size 128]
        [--tools nibble,modelopt,ort_asym,ort_sym] [--repeat N] [--check-parity] [--nibble build/nibble]
        [--json FILE] [--mixed]

Runs, one after the other (never in parallel: the box has 2 cores), each measured by bench/measure.py
(wall s, peak RSS of the process tree, bytes written), each into its own directory WORK/<tool>/:
  nibble    build/nibble quantize --onnx_path IN --output_path OUT --algo rtn_dq --block_size B
  modelopt  .venv-modelopt/bin/python bench/run_modelopt.py --algo rtn_dq --block_size B  (lm_head excluded)
  ort_asym  .venv-ortq/bin/python bench/run_ort_quantizer.py --block_size B               (class default)
  ort_sym   .venv-ortq/bin/python bench/run_ort_quantizer.py --block_size B --symmetric
A tool whose binary or venv is missing is reported as such and skipped.  Before the runs the model files are
read once so that every tool starts with a warm page cache.  With --repeat N each tool runs N times and the
table shows the fastest run (wall and CPU = user+sys of that run) and the largest peak RSS.  "model MB" counts
model.onnx and its external data only (nibble also copies tokenizer/GenAI files next to its output; all files
are in the JSON).  Prints a markdown table with nibble/peer ratios (< 1 means nibble is smaller/faster).

--check-parity (needs onnx + numpy in the running interpreter: use .venv-ortq/bin/python or .venv/bin/python)
compares nibble's and ModelOpt's outputs: for every ModelOpt ``<w>_i4`` initializer, whether nibble's
``<w>_i4`` codes are identical (INT4 unpacked from raw_data, low nibble first, two's complement) and whether
``<w>_scale`` is bit-identical (else the max relative difference), plus the zero points when present, the
DequantizeLinear attributes, and whether the other (unquantized) initializers are byte-identical.
--parity-only skips the runs and compares the outputs already in WORK (or --parity A.onnx B.onnx).
Exit status: 0, or 1 if a run failed or parity differs.
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

TOOLS = ["nibble", "modelopt", "ort_asym", "ort_sym"]


def tool_cmd(tool, model, out, bs, nibble):
    cmd, why = _tool_cmd(tool, model, out, bs, nibble)
    if cmd and getattr(ARGS, "mixed", False) and tool in ("nibble", "modelopt"):
        cmd = cmd + ["--enable_mixed_quant"]
    return cmd, why


def _tool_cmd(tool, model, out, bs, nibble):
    py_mo = os.path.join(ROOT, ".venv-modelopt", "bin", "python")
    py_ort = os.path.join(ROOT, ".venv-ortq", "bin", "python")
    if tool == "nibble":
        if not os.access(nibble, os.X_OK):
            return None, f"not built ({os.path.relpath(nibble, ROOT)} missing)"
        return [nibble, "quantize", "--onnx_path", model, "--output_path", out, "--algo", "rtn_dq",
                "--block_size", str(bs)], None
    if tool == "modelopt":
        if not os.access(py_mo, os.X_OK):
            return None, "missing .venv-modelopt (run scripts/setup_peers)"
        return [py_mo, os.path.join(HERE, "run_modelopt.py"), "--onnx_path", model, "--output_path", out,
                "--algo", "rtn_dq", "--block_size", str(bs)], None
    if tool in ("ort_asym", "ort_sym"):
        if not os.access(py_ort, os.X_OK):
            return None, "missing .venv-ortq (run scripts/setup_peers)"
        cmd = [py_ort, os.path.join(HERE, "run_ort_quantizer.py"), "--onnx_path", model, "--output_path", out,
               "--block_size", str(bs)]
        return cmd + (["--symmetric"] if tool == "ort_sym" else []), None
    raise ValueError(tool)


def warm_cache(model):
    d = os.path.dirname(os.path.abspath(model))
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def clean_dir(d):
    os.makedirs(d, exist_ok=True)
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if os.path.isfile(p) or os.path.islink(p):
            os.remove(p)


def run_all(args):
    model = os.path.abspath(args.model)
    warm_cache(model)
    results = {}
    for tool in args.tools:
        out_dir = os.path.join(args.work, tool)
        out = os.path.join(out_dir, "model.onnx")
        cmd, why = tool_cmd(tool, model, out, args.block_size, args.nibble)
        if cmd is None:
            results[tool] = {"skipped": why}
            print(f"[{tool}] skipped: {why}", file=sys.stderr)
            continue
        best = None
        for i in range(args.repeat):
            clean_dir(out_dir)
            log = os.path.join(args.work, f"{tool}.log")
            r = measure(cmd, outputs=[out_dir], log_path=log, timeout_s=args.timeout)
            print(f"[{tool}] run {i + 1}/{args.repeat}: rc={r.get('rc')} wall={r.get('wall_s')}s "
                  f"peak={r.get('peak_rss_mb')}MB out={r.get('output_mb')}MB log={log}", file=sys.stderr)
            if r.get("rc") != 0:
                best = r
                break
            r["all_wall_s"] = (best or {}).get("all_wall_s", []) + [r["wall_s"]]
            r["all_peak_rss_mb"] = (best or {}).get("all_peak_rss_mb", []) + [r["peak_rss_mb"]]
            if best is None or r["wall_s"] < best["wall_s"]:
                best = r  # fastest run's record ...
            best["all_wall_s"], best["all_peak_rss_mb"] = r["all_wall_s"], r["all_peak_rss_mb"]
            best["peak_rss_mb"] = max(r["all_peak_rss_mb"])  # ... with the largest peak RSS of all runs
        best["output_path"] = out
        # model size = the .onnx file and its external data (nibble also copies tokenizer/GenAI files)
        best["model_bytes"] = sum(f["bytes"] for f in best.get("output_files", [])
                                  if os.path.basename(f["path"]).startswith("model.onnx"))
        best["model_mb"] = round(best["model_bytes"] / 2**20, 3)
        results[tool] = best
    return results


def fmt_ratio(a, b):
    return f"{a / b:.3g}" if a is not None and b else "–"


def print_table(results, model):
    print(f"\n### RTN INT4 (block {ARGS.block_size}) on `{model}`\n")
    print("| tool | wall s | CPU s | peak RSS MB | model MB | nibble/peer wall | nibble/peer RSS | nibble/peer size |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    nb = results.get("nibble", {})
    ok_nb = nb.get("rc") == 0
    for tool, r in results.items():
        if "skipped" in r:
            print(f"| {tool} | – | – | – | – | {r['skipped']} | | |")
            continue
        if r.get("rc") != 0:
            what = "timed out" if r.get("timed_out") else f"FAILED rc={r.get('rc')} {r.get('error', '')}"
            print(f"| {tool} | {r.get('wall_s', '–')} | – | {r.get('peak_rss_mb', '–')} | – | {what} (log {r.get('log')}) | | |")
            continue
        if tool != "nibble" and ok_nb:
            ratios = [fmt_ratio(nb["wall_s"], r["wall_s"]), fmt_ratio(nb["peak_rss_mb"], r["peak_rss_mb"]),
                      fmt_ratio(nb["model_mb"], r["model_mb"])]
        else:
            ratios = ["", "", ""]
        print(f"| {tool} | {r['wall_s']:.2f} | {r['user_s'] + r['sys_s']:.2f} | {r['peak_rss_mb']:.0f} | "
              f"{r['model_mb']:.1f} | "
              + " | ".join(ratios) + " |")


# ----------------------------------------------------------------------------------------------------- parity

def int4_codes(t):
    """int8/int16 array of the INT4/UINT4 (or INT8/UINT8) values of a TensorProto (raw_data: low nibble first)."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    n = 1
    for d in t.dims:
        n *= d
    if t.data_type in (TensorProto.INT8, TensorProto.UINT8):
        return numpy_helper.to_array(t).astype(np.int16)
    if t.raw_data:
        b = np.frombuffer(t.raw_data, dtype=np.uint8)
        v = np.empty(b.size * 2, dtype=np.int16)
        v[0::2] = b & 0x0F
        v[1::2] = b >> 4
        v = v[:n]
        if t.data_type == TensorProto.INT4:
            v = np.where(v >= 8, v - 16, v)
        return v.astype(np.int8).reshape(tuple(t.dims))
    return numpy_helper.to_array(t).astype(np.int8)


def check_parity(nib_path, mo_path, verbose=True):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    nib = onnx.load(nib_path, load_external_data=True)
    mo = onnx.load(mo_path, load_external_data=True)
    ni = {t.name: t for t in nib.graph.initializer}
    mi = {t.name: t for t in mo.graph.initializer}
    ndq = {n.input[0]: n for n in nib.graph.node if n.op_type == "DequantizeLinear"}
    mdq = {n.input[0]: n for n in mo.graph.node if n.op_type == "DequantizeLinear"}
    rows, n_ok = [], 0
    weights = sorted(k[:-3] for k in mi if k.endswith("_i4"))
    for w in weights:
        row = {"weight": w}
        a = mi[w + "_i4"]
        b = ni.get(w + "_i4")
        if b is None:
            row.update(codes="MISSING in nibble", scales="", ok=False)
            rows.append(row)
            continue
        ca, cb = int4_codes(a), int4_codes(b)
        if a.data_type != b.data_type or ca.shape != cb.shape:
            row["codes"] = f"type/shape differ: {a.data_type}{list(a.dims)} vs {b.data_type}{list(b.dims)}"
            codes_ok = False
        else:
            diff = int(np.count_nonzero(ca != cb))
            codes_ok = diff == 0
            row["codes"] = "identical" if codes_ok else f"{diff}/{ca.size} differ (max |Δ| {int(np.abs(ca.astype(np.int16) - cb).max())})"
        sa, sb = mi[w + "_scale"], ni.get(w + "_scale")
        if sb is None:
            row["scales"], scales_ok = "MISSING in nibble", False
        else:
            xa, xb = numpy_helper.to_array(sa), numpy_helper.to_array(sb)
            if xa.dtype != xb.dtype or xa.shape != xb.shape:
                row["scales"], scales_ok = f"dtype/shape differ: {xa.dtype}{xa.shape} vs {xb.dtype}{xb.shape}", False
            elif xa.tobytes() == xb.tobytes():
                row["scales"], scales_ok = "identical", True
            else:
                rel = np.abs(xa.astype(np.float64) - xb) / np.maximum(np.abs(xa.astype(np.float64)), 1e-30)
                row["scales"] = f"{int(np.count_nonzero(xa != xb))}/{xa.size} differ, max rel {rel.max():.2e}"
                scales_ok = False
        extra_ok = True
        if w + "_zp" in mi:
            zb = ni.get(w + "_zp")
            zp_ok = zb is not None and np.array_equal(int4_codes(mi[w + "_zp"]), int4_codes(zb))
            row["zp"] = "identical" if zp_ok else "DIFFER"
            extra_ok &= zp_ok
        da, db = mdq.get(w + "_i4"), ndq.get(w + "_i4")
        if da is not None:
            attrs = lambda n: sorted((x.name, onnx.helper.get_attribute_value(x)) for x in n.attribute)  # noqa: E731
            if db is None:
                row["dq"], dq_ok = "no DequantizeLinear in nibble", False
            else:
                dq_ok = attrs(da) == attrs(db)
                row["dq"] = "same attrs" if dq_ok else f"{attrs(db)} vs {attrs(da)}"
            extra_ok &= dq_ok
        row["ok"] = codes_ok and scales_ok and extra_ok
        n_ok += row["ok"]
        rows.append(row)
    extra_nib = sorted(k[:-3] for k in ni if k.endswith("_i4") and k[:-3] not in set(weights))
    # unquantized initializers
    qnames = {w + s for w in weights for s in ("_i4", "_scale", "_zp")}
    others_a = {k: v for k, v in mi.items() if k not in qnames}
    others_b = {k: v for k, v in ni.items() if k not in qnames and not k.endswith(("_i4", "_scale", "_zp"))}
    other_diff = sorted(k for k in set(others_a) | set(others_b)
                        if k not in others_a or k not in others_b
                        or numpy_helper.to_array(others_a[k]).tobytes() != numpy_helper.to_array(others_b[k]).tobytes())
    print(f"\n### Parity nibble vs ModelOpt rtn_dq ({len(weights)} quantized weights)\n")
    if verbose:
        print("| weight | INT4 codes | scales | other |")
        print("|---|---|---|---|")
        for r in rows:
            other = ", ".join(f"{k}: {r[k]}" for k in ("zp", "dq") if k in r)
            print(f"| {r['weight']} | {r['codes']} | {r['scales']} | {other} |")
    from onnx import TensorProto
    n8 = sum(1 for w in weights if mi[w + "_i4"].data_type in (TensorProto.INT8, TensorProto.UINT8))
    n8_ok = sum(1 for r in rows if r["ok"] and mi[r["weight"] + "_i4"].data_type in (TensorProto.INT8, TensorProto.UINT8))
    print(f"\n{n_ok}/{len(weights)} weights identical (codes, scales, zp, DQ attributes); "
          f"of them 8-bit in ModelOpt's output: {n8}, identical {n8_ok}")
    if extra_nib:
        print(f"quantized by nibble only: {extra_nib}")
    print("unquantized initializers: " + ("identical" if not other_diff else f"differ/missing: {other_diff[:20]}"
                                         + (" ..." if len(other_diff) > 20 else "")))
    print(f"nodes: nibble {len(nib.graph.node)}, ModelOpt {len(mo.graph.node)}; opset nibble "
          f"{[(o.domain, o.version) for o in nib.opset_import]} ModelOpt {[(o.domain, o.version) for o in mo.opset_import]}")
    same_nodes = len(nib.graph.node) == len(mo.graph.node)
    return n_ok == len(weights) and not extra_nib and not other_diff and same_nodes, rows


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="input ONNX model (fp32/fp16, external data beside it)")
    ap.add_argument("--work", default="/tmp/rtn_sbs")
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run")
    ap.add_argument("--nibble", default=os.path.join(ROOT, "build", "nibble"))
    ap.add_argument("--check-parity", dest="check_parity", action="store_true")
    ap.add_argument("--parity-only", dest="parity_only", action="store_true",
                    help="no runs: compare WORK/nibble/model.onnx with WORK/modelopt/model.onnx")
    ap.add_argument("--parity", nargs=2, metavar=("NIBBLE_ONNX", "MODELOPT_ONNX"), help="compare these two files")
    ap.add_argument("--quiet-parity", action="store_true", help="summary only, no per-weight table")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--mixed", action="store_true",
                    help="nibble and ModelOpt with --enable_mixed_quant (INT8 layers)")
    ARGS = args = ap.parse_args()
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in args.tools if t not in TOOLS]
    if bad:
        ap.error(f"unknown tools {bad}; choose from {TOOLS}")
    args.work = os.path.abspath(args.work)
    os.makedirs(args.work, exist_ok=True)
    status = 0

    if args.parity:
        ok, _ = check_parity(args.parity[0], args.parity[1], not args.quiet_parity)
        return 0 if ok else 1
    if not args.parity_only:
        if not args.model:
            ap.error("model path required")
        results = run_all(args)
        print_table(results, args.model)
        if any("skipped" not in r and r.get("rc") != 0 for r in results.values()):
            status = 1
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": os.path.abspath(args.model), "block_size": args.block_size,
                           "results": results}, f, indent=2)
    if args.check_parity or args.parity_only:
        a = os.path.join(args.work, "nibble", "model.onnx")
        b = os.path.join(args.work, "modelopt", "model.onnx")
        missing = [p for p in (a, b) if not os.path.exists(p)]
        if missing:
            print(f"\nparity: cannot compare, missing {missing}")
            status = status or 1
        else:
            try:
                import onnx  # noqa: F401
            except ImportError:
                py = os.path.join(ROOT, ".venv-ortq", "bin", "python")
                print("\nparity: onnx not importable here; re-running the check with .venv-ortq", flush=True)
                r = subprocess.run([py, os.path.abspath(__file__), "--parity", a, b]
                                   + (["--quiet-parity"] if args.quiet_parity else []))
                return status or r.returncode
            ok, _ = check_parity(a, b, not args.quiet_parity)
            status = status or (0 if ok else 1)
    return status


if __name__ == "__main__":
    sys.exit(main())

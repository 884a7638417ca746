#!/usr/bin/env python3
"""Runs ONNX Runtime's own INT4 weight quantizer (onnxruntime 1.24.4,
``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``, DEFAULT = RTN in C++/MLAS).

Run with the venv made by scripts/setup_peers:

    .venv-ortq/bin/python bench/run_ort_quantizer.py --onnx_path IN.onnx --output_path OUT.onnx \
        [--block_size 128] [--symmetric] [--algo rtn|hqq] [--format QOperator|QDQ] [--accuracy_level N]

Class defaults are kept (bits 4, block 128, asymmetric, QOperator, accuracy_level None, MatMul only);
note the module's own CLI has other defaults (block 32, symmetric).  To compare with ModelOpt's
direct-API default (``nodes_to_exclude=[r"/lm_head"]``, re.match), every node whose name matches a
--exclude regex (default ``/lm_head``) is excluded; ORT's quantizer itself takes exact node names.

Saved the way the module's CLI saves: ``quant.model.save_model_to_file(OUT, use_external_data_format=True)``
= topological sort, all tensors >= 1024 bytes in one file ``basename(OUT)+".data"``.  A stale OUT / data
file is removed first.
"""
import argparse
import json
import os
import re
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx_path", required=True)
    ap.add_argument("--output_path", required=True)
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--symmetric", action="store_true")
    ap.add_argument("--algo", default="rtn", choices=["rtn", "hqq"],
                    help="rtn: the class default (DEFAULT, RTN in C++/MLAS); hqq: HQQWeightOnlyQuantConfig "
                         "(its defaults: lp_norm 0.7, beta 10, kappa 1.01, 20 iterations; float zero points)")
    ap.add_argument("--format", default="QOperator", choices=["QOperator", "QDQ"])
    ap.add_argument("--accuracy_level", type=int, default=None)
    ap.add_argument("--exclude", action="append", default=None,
                    help="node-name regex to exclude (re.match, repeatable); default '/lm_head'")
    ap.add_argument("--timings_json", help="write {import_s, load_s, quantize_s, save_s} here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer
    t_imp = time.perf_counter()

    model = onnx.load(args.onnx_path, load_external_data=True)
    pats = args.exclude if args.exclude else ["/lm_head"]
    excluded = [n.name for n in model.graph.node if any(re.match(p, n.name) for p in pats)]
    t_load = time.perf_counter()

    fmt = QuantFormat.QDQ if args.format == "QDQ" else QuantFormat.QOperator
    print(f"run_ort_quantizer: algo={args.algo} block_size={args.block_size} symmetric={args.symmetric} format={args.format} "
          f"accuracy_level={args.accuracy_level} excluded={excluded}", flush=True)
    algo_config = HQQWeightOnlyQuantConfig(block_size=args.block_size, bits=4, quant_format=fmt) \
        if args.algo == "hqq" else None
    quant = MatMulNBitsQuantizer(model, bits=4, block_size=args.block_size, is_symmetric=args.symmetric,
                                 accuracy_level=args.accuracy_level, nodes_to_exclude=excluded,
                                 quant_format=fmt, algo_config=algo_config)
    quant.process()
    t_q = time.perf_counter()

    out = os.path.abspath(args.output_path)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    for p in (out, out + ".data"):
        if os.path.exists(p):
            os.remove(p)
    quant.model.save_model_to_file(out, use_external_data_format=True)
    t_s = time.perf_counter()
    timings = {"import_s": round(t_imp - t0, 3), "load_s": round(t_load - t_imp, 3),
               "quantize_s": round(t_q - t_load, 3), "save_s": round(t_s - t_q, 3)}
    print(f"run_ort_quantizer: wrote {out} (+{os.path.basename(out)}.data) {json.dumps(timings)}", flush=True)
    if args.timings_json:
        with open(args.timings_json, "w") as f:
            json.dump(timings, f)


if __name__ == "__main__":
    main()

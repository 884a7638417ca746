#!/usr/bin/env python3
"""Runs ONNX Runtime's own INT4 weight quantizer (onnxruntime 1.24.4,
``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``, DEFAULT = RTN in C++/MLAS).

Run with the venv made by scripts/setup_peers:

    .venv-ortq/bin/python bench/run_ort_quantizer.py --onnx_path IN.onnx --output_path OUT.onnx \
        [--block_size 128] [--symmetric] [--format QOperator|QDQ] [--accuracy_level N] \
        [--algo default|gptq|hqq|k_quant] [--calib_npz NPZ]

--algo picks the algorithm config: ``default`` (RTN, C++/MLAS), ``gptq`` (GPTQWeightOnlyQuantConfig, its
defaults: percdamp 0.01, no act-order, per-channel; calibration from --calib_npz, one sample per row of
its arrays), ``hqq`` (HQQWeightOnlyQuantConfig; imports torch, which .venv-ortq does not have) or
``k_quant`` (KQuantWeightOnlyQuantConfig).  ORT's GPTQ ignores ``nodes_to_exclude``: the excluded nodes
are passed to it as "fp32" in its per-node weight config instead (what its RTN path does).

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


class NpzReader:
    """ORT CalibrationDataReader over an .npz: sample i = every array's row i, batch 1."""

    def __init__(self, path):
        import numpy as np
        with np.load(path) as z:
            self.arrays = {k: z[k] for k in z.files}
        self.n = len(next(iter(self.arrays.values())))
        self.i = 0

    def get_next(self):
        if self.i >= self.n:
            return None
        self.i += 1
        return {k: v[self.i - 1:self.i] for k, v in self.arrays.items()}

    def __iter__(self):
        return iter(self.get_next, None)


def algo_config(args, fmt):
    """None (the class's DEFAULT RTN) or the config object of --algo."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mq
    if args.algo == "default":
        return None
    if args.algo == "gptq":
        if not args.calib_npz:
            raise SystemExit("run_ort_quantizer: --algo gptq needs --calib_npz")
        install_torch_stub()
        return mq.GPTQWeightOnlyQuantConfig(calibration_data_reader=NpzReader(args.calib_npz),
                                            block_size=args.block_size, quant_format=fmt)
    if args.algo == "hqq":
        return mq.HQQWeightOnlyQuantConfig(block_size=args.block_size, bits=4, quant_format=fmt)
    return mq.KQuantWeightOnlyQuantConfig(quant_format=fmt)


def install_torch_stub():
    """ORT's GPTQ calls neural_compressor.util.to_numpy on every calibration array, which imports torch
    before it looks at the type; ours are numpy arrays, so torch is never used.  A stub that raises on
    any use stands in for it (.venv-ortq has no torch); a real torch, if installed, is used instead."""
    import importlib.machinery
    import importlib.util
    import sys
    import types
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        return

    class TorchStub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            raise RuntimeError(f"run_ort_quantizer: torch.{name} used, but torch is a stub here")
    stub = TorchStub("torch")
    stub.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    sys.modules["torch"] = stub


def fix_odd_block_zero_points():
    """ORT's GPTQ and k_quant (neural_compressor.weight_only.make_matmul_weight_only_node) pack the 4-bit
    zero points of all columns as one flat stream, then reshape to [N, -1]: with an odd number of blocks
    per column (K=576, block 128: 5) that fails with "cannot reshape array of size 2400 into shape
    (960,newaxis)".  MatMulNBits wants each column's zero points packed on their own, the odd last
    nibble padded.  This wrapper builds the node without zero points and adds them packed that way;
    with an even block count it gives the same bytes as ORT's own packing."""
    import numpy as np
    import onnx
    from onnxruntime.quantization.neural_compressor import weight_only as wo
    make = wo.make_matmul_weight_only_node

    def make_fixed(node, weight_shape, num_bits, group_size, k_blocks, q_weight, scale, zero_point,
                   accuracy_level=0):
        if zero_point is None or num_bits != 4 or k_blocks % 2 == 0:
            return make(node, weight_shape, num_bits, group_size, k_blocks, q_weight, scale, zero_point,
                        accuracy_level)
        qnode, inits = make(node, weight_shape, num_bits, group_size, k_blocks, q_weight, scale, None,
                            accuracy_level)
        zp = np.asarray(zero_point).astype(np.uint8).reshape(weight_shape[1], k_blocks)
        zp = np.concatenate([zp, np.full((zp.shape[0], 1), 8, np.uint8)], axis=1)
        packed = (zp[:, ::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
        t = onnx.helper.make_tensor(name=node.input[1] + "_zp", data_type=onnx.TensorProto.UINT8,
                                    dims=packed.shape, vals=packed.tobytes(), raw=True)
        qnode.input.append(t.name)
        return qnode, inits + [t]
    wo.make_matmul_weight_only_node = make_fixed


def keep_excluded_float(quant, excluded):
    """ORT's GPTQ path builds its per-node config without nodes_to_exclude; mark them "fp32" there."""
    make = quant._generate_q4_node_config

    def with_excluded():
        cfg = make()
        cfg.update({n: "fp32" for n in excluded})
        return cfg
    quant._generate_q4_node_config = with_excluded


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx_path", required=True)
    ap.add_argument("--output_path", required=True)
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--symmetric", action="store_true")
    ap.add_argument("--format", default="QOperator", choices=["QOperator", "QDQ"])
    ap.add_argument("--accuracy_level", type=int, default=None)
    ap.add_argument("--exclude", action="append", default=None,
                    help="node-name regex to exclude (re.match, repeatable); default '/lm_head'")
    ap.add_argument("--algo", default="default", choices=["default", "gptq", "hqq", "k_quant"])
    ap.add_argument("--calib_npz", help="calibration inputs for --algo gptq (bench/compare_lib.build_calib_npz)")
    ap.add_argument("--no_zp_fix", action="store_true",
                    help="run ORT's GPTQ/k_quant zero-point packing as shipped (fails when K/block is odd)")
    ap.add_argument("--timings_json", help="write {import_s, load_s, quantize_s, save_s} here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    t_imp = time.perf_counter()

    model = onnx.load(args.onnx_path, load_external_data=True)
    pats = args.exclude if args.exclude else ["/lm_head"]
    excluded = [n.name for n in model.graph.node if any(re.match(p, n.name) for p in pats)]
    t_load = time.perf_counter()

    fmt = QuantFormat.QDQ if args.format == "QDQ" else QuantFormat.QOperator
    print(f"run_ort_quantizer: algo={args.algo} block_size={args.block_size} symmetric={args.symmetric} format={args.format} "
          f"accuracy_level={args.accuracy_level} excluded={excluded}", flush=True)
    quant = MatMulNBitsQuantizer(model, bits=4, block_size=args.block_size, is_symmetric=args.symmetric,
                                 accuracy_level=args.accuracy_level, nodes_to_exclude=excluded,
                                 quant_format=fmt, algo_config=algo_config(args, fmt))
    if args.algo == "gptq":
        keep_excluded_float(quant, excluded)
    if args.algo in ("gptq", "k_quant") and not args.no_zp_fix:
        fix_odd_block_zero_points()
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

#!/usr/bin/env python3
"""Runs NVIDIA ModelOpt's ONNX INT4 quantizer (nvidia-modelopt 0.47.0) on CPU (on a GPU where the venv
has CuPy: bench/gpu_check), the way its ORT-GenAI example does (examples/windows/onnx_ptq/genai_llm/quantize.py), and saves the result like that example.

Run with the lean ModelOpt venv made by scripts/setup_peers:

    .venv-modelopt/bin/python bench/run_modelopt.py --onnx_path IN.onnx --output_path OUT.onnx \
        --algo rtn_dq|rtn|awq_lite|awq_full|awq_clip [--block_size 128] [--use_zero_point] \
        [--calib_npz FILE | --calib_random N [--calib_seq_len 512]] [--no_fuse] [--no_fast_path] \
        [--enable_mixed_quant] [--layers_8bit PATTERNS]

What is called: ``modelopt.onnx.quantization.int4.quantize(IN, calibration_method=algo,
calibration_data_reader=..., calibration_eps=['cpu'] (--calibration_eps), use_zero_point=..., block_size=...,
nodes_to_exclude=['/lm_head'])``; every other argument is left at the API default
(awqlite_fuse_nodes=True, alpha steps, awqclip_bsz_col 1024, ...), plus
``enable_fast_path_using_high_sysram=True`` for awq_lite/awq_full (same output, one ORT run per sample
instead of one per MatMul per sample; --no_fast_path turns it off). --enable_mixed_quant / --layers_8bit are
passed as the kwargs of the same names (INT8 layers).

Saving (GenAI example): opset_import rewritten to ("",21) + ("com.microsoft",1) + other domains when the
default-domain opset is < 21, then ``onnx.save_model(m, OUT, save_as_external_data=True,
all_tensors_to_one_file=True, location=basename(OUT)+"_data", size_threshold=0)``.  A stale OUT or
OUT_data is deleted first (onnx appends to an existing data file).  Caveat: with size_threshold=0 even
tiny int64 axes/shape initializers go external, and ORT 1.24.4 then refuses the model ("Cannot parse
data from external tensors") when such constants are initializers rather than Constant nodes (true of
tools/smollm2_to_onnx.py's models); --size_threshold 1024 avoids it (output otherwise identical).

Workarounds needed to run ModelOpt without a GPU (see bench/README.md):
  * ``torch`` is imported at module level by modelopt/onnx/quantization/qdq_utils.py but only used for
    FP8 export; a stub module is put in sys.modules (after onnxruntime.quantization is imported,
    because onnxruntime.tools probes for torch with importlib.util.find_spec).  Any attribute access on
    the stub raises, so a real use of torch cannot go unnoticed.
  * Without CuPy, int4.py runs on numpy, but awq_lite/awq_full with the default awqlite_fuse_nodes=True
    call ``ndarray.get()`` (a CuPy-only method) when folding 1/s into a producer's initializer
    (int4.py:1330, ``numpy_helper.from_array(new_tensor.get(), ...)``).  The module's source is
    re-executed in its own namespace with that single expression replaced by ``numpy.asarray(new_tensor)``,
    which is what .get() returns on a GPU (a host copy).  The replacement is asserted to occur exactly
    once.  Alternatively --no_fuse passes awqlite_fuse_nodes=False (a different output: no
    sibling-scale averaging, a Mul per MatMul).

Calibration data (awq_*): --calib_npz FILE holds one array per model input, named after the input, whose
first axis is samples (batch 1 each: sample i = arr[i:i+1]).  Inputs the model has and the npz lacks are
synthesised: past_key_values.* as zeros with past length 0 (dtype from the model), attention_mask as
ones, position_ids as arange.  --calib_random N synthesises N samples of --calib_seq_len random token ids
(seed 0, uniform below the embedding table's row count) instead.  Without either, ModelOpt's own RandomDataProvider is used (one random sample, unknown
dims = 1).  ModelOpt materialises all samples in a list; so does this script.
"""
import argparse
import importlib.machinery
import json
import os
import sys
import time
import types


def _install_torch_stub():
    if "torch" in sys.modules:
        return
    try:
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            return  # a real torch is installed (full install): use it
    except (ImportError, ValueError):
        pass
    import onnxruntime.quantization  # noqa: F401  (probes find_spec("torch") on import)

    class _TorchStub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            raise RuntimeError(f"bench/run_modelopt.py: torch.{name} used, but torch is a stub in the "
                               "lean ModelOpt venv (install torch or use the full install)")

    stub = _TorchStub("torch")
    stub.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    sys.modules["torch"] = stub


def _patch_cupy_get(int4):
    """Re-executes int4.py with `new_tensor.get()` -> `numpy.asarray(new_tensor)` (CuPy-only method)."""
    if getattr(int4, "has_cupy", False):
        return False
    src_path = int4.__file__
    with open(src_path) as f:
        src = f.read()
    old = "numpy_helper.from_array(new_tensor.get(), tensor.name)"
    new = "numpy_helper.from_array(numpy.asarray(new_tensor), tensor.name)"
    n = src.count(old)
    if n != 1:
        raise RuntimeError(f"expected exactly one '{old}' in {src_path}, found {n}: ModelOpt version changed?")
    if "\nimport numpy\n" not in src:
        raise RuntimeError(f"{src_path} no longer imports numpy as 'numpy'")
    exec(compile(src.replace(old, new), src_path, "exec"), int4.__dict__)
    return True


def _dim(d, default):
    return d.dim_value if d.HasField("dim_value") else default


def _vocab_size(model):
    """Rows of the embedding table gathered by input_ids, else the last dim of 'logits', else 32000."""
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == "input_ids" and n.input[0] in inits:
            return inits[n.input[0]].dims[0]
    for o in model.graph.output:
        if o.name == "logits":
            d = o.type.tensor_type.shape.dim
            if d and d[-1].HasField("dim_value"):
                return d[-1].dim_value
    return 32000


def _synth_inputs(model, given, seq_len, rng, vocab):
    """Completes a sample dict with the GenAI-style inputs the model has and `given` lacks."""
    import numpy as np
    from onnx import helper

    init_names = {i.name for i in model.graph.initializer}
    sample = dict(given)
    ids = sample.get("input_ids")
    if ids is None:
        ids = rng.integers(0, vocab, size=(1, seq_len), dtype=np.int64)
        if any(i.name == "input_ids" for i in model.graph.input):
            sample["input_ids"] = ids
    seq = ids.shape[1]
    for inp in model.graph.input:
        if inp.name in init_names or inp.name in sample:
            continue
        tt = inp.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        dims = list(tt.shape.dim)
        if inp.name.startswith("past_key_values") or inp.name.startswith("past_"):
            # [batch, kv_heads, past_seq (0), head_dim]
            shape = [1] + [_dim(d, 1) for d in dims[1:]]
            if len(shape) == 4:
                shape[2] = 0
            sample[inp.name] = np.zeros(shape, dtype=dtype)
        elif "mask" in inp.name:
            sample[inp.name] = np.ones((1, seq), dtype=dtype)
        elif "position" in inp.name:
            sample[inp.name] = np.arange(seq, dtype=dtype)[None, :]
        else:
            raise SystemExit(f"run_modelopt: cannot synthesise calibration input '{inp.name}'")
    return sample


def load_calibration(args, model_path):
    import numpy as np
    import onnx

    if not args.calib_npz and not args.calib_random:
        return None  # ModelOpt's RandomDataProvider
    model = onnx.load(model_path, load_external_data=False)
    rng = np.random.default_rng(0)
    vocab = _vocab_size(model)
    samples = []
    if args.calib_npz:
        data = np.load(args.calib_npz)
        n = min(data[k].shape[0] for k in data.files)
        for i in range(n):
            samples.append(_synth_inputs(model, {k: data[k][i:i + 1] for k in data.files},
                                         args.calib_seq_len, rng, vocab))
    else:
        for _ in range(args.calib_random):
            samples.append(_synth_inputs(model, {}, args.calib_seq_len, rng, vocab))
    return samples


def convert_opset_to_21_proto(model_proto):
    """Same rewrite as the GenAI example: no version converter, only the opset_import list."""
    from onnx import helper

    current = {o.domain: o.version for o in model_proto.opset_import}
    if current.get("", 0) >= 21:
        return model_proto
    new = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    new += [helper.make_opsetid(d, v) for d, v in current.items() if d not in ("", "com.microsoft")]
    model_proto.ClearField("opset_import")
    model_proto.opset_import.extend(new)
    return model_proto


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx_path", required=True)
    ap.add_argument("--output_path", required=True)
    ap.add_argument("--algo", default="rtn_dq",
                    choices=["rtn_dq", "rtn", "awq_lite", "awq_full", "awq_clip"])
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--use_zero_point", action="store_true")
    ap.add_argument("--calib_npz")
    ap.add_argument("--calib_random", type=int, default=0, metavar="N")
    ap.add_argument("--calib_seq_len", type=int, default=512)
    ap.add_argument("--no_fuse", action="store_true", help="awqlite_fuse_nodes=False")
    ap.add_argument("--no_fast_path", action="store_true",
                    help="do not pass enable_fast_path_using_high_sysram=True (awq_lite/awq_full)")
    ap.add_argument("--exclude", action="append", default=None,
                    help="nodes_to_exclude regex (repeatable); default ['/lm_head']")
    ap.add_argument("--size_threshold", type=int, default=0,
                    help="onnx.save_model size_threshold (0 = GenAI example: every tensor external; 1024 keeps "
                         "tiny constants inline, which ORT needs when shape/axes constants are initializers)")
    ap.add_argument("--enable_mixed_quant", action="store_true",
                    help="enable_mixed_quant=True: ModelOpt's default INT8 layer choice")
    ap.add_argument("--layers_8bit", default="", help="layers_8bit=... (comma-separated patterns, §7.2)")
    ap.add_argument("--calibration_eps", default="cpu",
                    help="ONNX Runtime providers for calibration, comma-separated: cpu, cuda (cuda:0), dml, trt "
                         "(ModelOpt's calibration_eps; cuda needs onnxruntime-gpu)")
    ap.add_argument("--log_level", default="INFO")
    ap.add_argument("--timings_json", help="write {load_s, quantize_s, save_s} here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    _install_torch_stub()
    import onnx
    import modelopt.onnx.quantization.int4 as int4

    patched = _patch_cupy_get(int4)
    calib = load_calibration(args, args.onnx_path)
    t_imp = time.perf_counter()

    kwargs = {}
    if args.algo in ("awq_lite", "awq_full"):
        kwargs["awqlite_fuse_nodes"] = not args.no_fuse
        if not args.no_fast_path:
            kwargs["enable_fast_path_using_high_sysram"] = True
    if args.enable_mixed_quant:
        kwargs["enable_mixed_quant"] = True
    if args.layers_8bit:
        kwargs["layers_8bit"] = args.layers_8bit
    print(f"run_modelopt: algo={args.algo} block_size={args.block_size} zero_point={args.use_zero_point} "
          f"calib_samples={'random(ModelOpt)' if calib is None else len(calib)} "
          f"cupy_get_patch={patched} kwargs={kwargs}", flush=True)
    model = int4.quantize(
        args.onnx_path,
        calibration_method=args.algo,
        calibration_data_reader=calib,
        calibration_eps=[e if e != "cuda" else "cuda:0" for e in args.calibration_eps.split(",")],
        use_zero_point=args.use_zero_point,
        block_size=args.block_size,
        nodes_to_exclude=args.exclude if args.exclude else ["/lm_head"],
        log_level=args.log_level,
        **kwargs,
    )
    t_q = time.perf_counter()

    model = convert_opset_to_21_proto(model)
    out = os.path.abspath(args.output_path)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    data_name = os.path.basename(out) + "_data"
    for p in (out, os.path.join(os.path.dirname(out), data_name)):
        if os.path.exists(p):
            os.remove(p)
    onnx.save_model(model, out, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=args.size_threshold)
    t_s = time.perf_counter()
    timings = {"import_s": round(t_imp - t0, 3), "quantize_s": round(t_q - t_imp, 3),
               "save_s": round(t_s - t_q, 3)}
    print(f"run_modelopt: wrote {out} (+{data_name}) {json.dumps(timings)}", flush=True)
    if args.timings_json:
        with open(args.timings_json, "w") as f:
            json.dump(timings, f)


if __name__ == "__main__":
    main()

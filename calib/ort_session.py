"""ONNX Runtime for calibration: the execution providers --eps names, and the session that runs the
calibration graph (given as bytes, with the model's folder as its external-data folder)."""
from __future__ import annotations

from messages import CalibError, first_line, warn

# --eps names (ModelOpt's calibration_eps) -> ONNX Runtime providers
EPS = {
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
    "dml": "DmlExecutionProvider",
    "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}


def parse_eps(spec: str) -> list[tuple[str, str, dict]]:
    """'cuda:1,cpu' -> [(token, provider, options), ...]; unknown names are an error."""
    out = []
    for tok in [t.strip() for t in spec.split(",") if t.strip()]:
        base, _, dev = tok.partition(":")
        prov = EPS.get(base.lower())
        if prov is None:
            raise CalibError(f"--eps: unknown execution provider '{tok}' (known: cuda, cpu, dml, NvTensorRtRtx, trt)")
        opts = {}
        if dev:
            if not dev.isdigit():
                raise CalibError(f"--eps: '{tok}': the device id after ':' must be a number")
            opts["device_id"] = dev
        out.append((tok, prov, opts))
    if not out:
        raise CalibError("--eps: no execution provider given")
    return out


def select_providers(spec: str) -> list[tuple[str, dict]]:
    import onnxruntime as ort
    avail = ort.get_available_providers()
    chosen = []
    for tok, prov, opts in parse_eps(spec):
        if prov not in avail:
            warn(f"execution provider '{tok}' ({prov}) is not available in this onnxruntime; trying the next")
            continue
        if prov not in [p for p, _ in chosen]:
            chosen.append((prov, opts))
    if not chosen:
        raise CalibError(f"--eps {spec}: none of these execution providers is available "
                         f"(this onnxruntime has: {', '.join(avail)})")
    return chosen


def release_large_blocks() -> None:
    """glibc: blocks of 4 MiB and more are mmap'ed and so go back to the system when freed (the dynamic
    threshold would otherwise rise and keep ONNX Runtime's freed weight casts in the heap)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, 4 * 2**20)   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def make_session(model_bytes: bytes, model_dir: str, providers: list[tuple[str, dict]], model_path: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # as ModelOpt
    so.log_severity_level = 3
    # No arena and no memory pattern: on CPU, ONNX Runtime runs an fp16 model's MatMuls in fp32 and casts
    # every weight at every run; its arena keeps the high-water mark of those casts (SmolLM2-135M fp16:
    # 969 MB peak with the arena, 630 MB without, the same speed with large blocks mmap'ed, see
    # release_large_blocks; fp32: 639 / 630 MB).
    so.enable_cpu_mem_arena = False
    so.enable_mem_pattern = False
    # Priority-based order runs each weight's Cast just before its MatMul; the default order starts with
    # all of them (no inputs to wait for), so every fp32 cast is alive at once (fp16: 630 -> 447 MB).
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", model_dir)
    # ORT's threads would spin while numpy/BLAS computes the statistics between runs
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    names = [p for p, _ in providers]
    opts = [o for _, o in providers]
    try:
        sess = ort.InferenceSession(model_bytes, so, providers=names, provider_options=opts)
    except Exception as e:  # noqa: BLE001 - ORT's exceptions (Fail, InvalidGraph, ...)
        raise CalibError(f"{model_path}: ONNX Runtime cannot load the model ({first_line(e)})") from None
    got = sess.get_providers()
    if got and got[0] != names[0]:
        warn(f"{names[0]} could not be used; running on {got[0]}")
    return sess

"""The AWQ scale grid computed with numpy itself (the `grid` subcommand): numpy's float32 power decides
ModelOpt's scales, so --awq_mode modelopt asks for them here."""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from messages import CalibError, first_line
from output_files import write_array


def get_scale(x_max, w_max, alpha):
    """ModelOpt 0.47 int4.py get_scale, verbatim: x_max / w_max numpy arrays (float32 for fp32 models,
    float16 for fp16 ones), alpha a Python float (AWQLiteHelper's k.item())."""
    scales = (x_max.__pow__(alpha) / (w_max.__pow__(1 - alpha) + np.finfo(w_max.dtype).tiny)).clip(
        min=1e-4, max=1e4
    )
    scales = scales / np.sqrt(scales.max() * scales.min())
    return scales


def get_scale_per_subgraph(x_m, w_m, alpha):
    """ModelOpt 0.47 run_awq_scale_search_per_subgraph's formula, verbatim: alpha is an np.float64 of
    np.arange there, so under NumPy 2 the scale is float64 (cast to float32 by the caller)."""
    alpha = np.float64(alpha)
    awq_scale = (x_m.__pow__(alpha) / (w_m.__pow__(1 - alpha) + 1e-4)).clip(min=1e-4)
    awq_scale = awq_scale / np.sqrt(awq_scale.max() * awq_scale.min())
    awq_scale[np.isinf(awq_scale)] = 1
    awq_scale[np.isnan(awq_scale)] = 1
    return awq_scale


_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_GRID_DTYPES = {"float32": (np.float32, "f32"), "float16": (np.float16, "f16")}


def grid(a) -> int:
    req_path = a.request
    if not os.path.isfile(req_path):
        raise CalibError(f"--request {req_path}: file not found")
    try:
        with open(req_path, encoding="utf-8") as f:
            req = json.load(f)
    except (OSError, ValueError) as e:
        raise CalibError(f"--request {req_path}: not JSON ({first_line(e)})") from None
    if not isinstance(req, dict):
        raise CalibError(f"--request {req_path}: a JSON object expected")
    alphas = req.get("alphas")
    if not isinstance(alphas, list) or not alphas or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in alphas):
        raise CalibError(f"--request {req_path}: \"alphas\" must be a non-empty list of numbers")
    alphas = [float(x) for x in alphas]
    items = req.get("items")
    if not isinstance(items, list):
        raise CalibError(f"--request {req_path}: \"items\" must be a list")
    base = os.path.dirname(os.path.abspath(req_path))
    dtype_name = req.get("dtype", "float32")
    if dtype_name not in _GRID_DTYPES:
        raise CalibError(f"--request {req_path}: \"dtype\" must be float32 or float16")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        raise CalibError(f"--out {a.out}: cannot create the folder ({e.strerror or e})") from None
    formula = req.get("formula", "per_node")
    if formula not in ("per_node", "per_subgraph"):
        raise CalibError(f"--request {req_path}: \"formula\" must be per_node or per_subgraph")
    scale_fn = get_scale if formula == "per_node" else get_scale_per_subgraph
    np_dt, ext = _GRID_DTYPES[dtype_name]
    file_dt = np.dtype(np_dt).newbyteorder("<")
    for j, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("id"), str) or not _ID_RE.match(it["id"]) \
                or it["id"] in (".", "..") or not isinstance(it.get("K"), int) or it["K"] <= 0 \
                or not isinstance(it.get("x_mean"), str) or not isinstance(it.get("w_mean"), str):
            raise CalibError(f"--request {req_path}: item {j} needs \"id\" (letters, digits, _.-), "
                             f"\"x_mean\", \"w_mean\" (file names) and \"K\" (positive int)")
        K = it["K"]
        vec = {}
        for key in ("x_mean", "w_mean"):
            p = os.path.join(base, it[key])
            try:
                v = np.fromfile(p, dtype=file_dt)
            except OSError as e:
                raise CalibError(f"--request {req_path}: item '{it['id']}': cannot read {key} file {p} "
                                 f"({e.strerror or e})") from None
            if os.path.getsize(p) != K * file_dt.itemsize:
                raise CalibError(f"--request {req_path}: item '{it['id']}': {key} file {p} holds "
                                 f"{os.path.getsize(p)} bytes, {K} {dtype_name} values expected")
            vec[key] = v.astype(np_dt)    # native byte order, the dtype ModelOpt has
        with np.errstate(all="ignore"):
            rows = [scale_fn(vec["x_mean"], vec["w_mean"], alpha).astype(np_dt) for alpha in alphas]
        outp = os.path.join(a.out, f"{it['id']}.grid.{ext}")
        try:
            write_array(outp, np.stack(rows), file_dt)
        except OSError as e:
            raise CalibError(f"--out {a.out}: cannot write {outp} ({e.strerror or e})") from None
    return 0

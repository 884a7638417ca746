"""What calibration feeds the model besides the data: the model's inputs (InputSpec) and the GenAI
inputs a batch lacks, synthesised by FeedBuilder (past KV, attention_mask, position_ids, token_type_ids).
A model input that cannot be fed raises CalibError naming the input."""
from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from messages import CalibError, warn

PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


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


def fixed_dim(d) -> int | None:
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
        heads = fixed_dim(dims[1]) if dims else None
        if heads is None:
            heads = dec.get("num_key_value_heads")
        hd = fixed_dim(dims[3]) if dims else None
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
        b0 = fixed_dim(dims[0]) if dims else None
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


def count_tokens(tt: int, tu: int, tok_mask, flat_mask, feeds) -> tuple[int, int]:
    """Tokens so far (all, unpadded) after one more batch."""
    if tok_mask is not None:
        return tt + tok_mask.size, tu + int(flat_mask.sum())
    if "input_ids" in feeds:
        return tt + feeds["input_ids"].size, tu + feeds["input_ids"].size
    return tt, tu


def batch_rows(batches) -> int:
    """The token rows of one batch, read from the first: input_ids' or the attention mask's size, else
    (a model fed hidden states) the largest float feed's size over its last axis. What the session
    returns of an activation's rows for the token sample is sized by it."""
    feeds, tok_mask = next(iter(batches))
    if "input_ids" in feeds:
        return int(np.asarray(feeds["input_ids"]).size)
    if tok_mask is not None:
        return int(np.asarray(tok_mask).size)
    arrays = [np.asarray(a) for a in feeds.values()]
    return max((a.size // a.shape[-1] for a in arrays if a.dtype.kind == "f" and a.ndim >= 2 and a.shape[-1]),
               default=0)

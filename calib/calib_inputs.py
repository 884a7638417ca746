"""Calibration inputs for calib/capture.py: the model's feeds per batch (texts.py reads the texts,
text_tokenizer.py tokenizes them, model_feeds.py synthesises the inputs a batch lacks).

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

import os

import numpy as np

from messages import CalibError, note, warn
from model_feeds import FeedBuilder, FeedOptions, InputSpec, fixed_dim
from text_tokenizer import TextTokenizer
from texts import dataset_texts, txt_windows


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
        if s.dims and fixed_dim(s.dims[0]) not in (None, batch_size):
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
                    d = fixed_dim(s.dims[ax])
                    if d is not None and a.shape[ax] != d:
                        raise CalibError(f"--calib_data {path}: array '{k}' has shape {list(a.shape)}, the model's "
                                         f"input '{k}' is {s.describe()} (axis {ax} differs)")
                d0 = fixed_dim(s.dims[0])
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

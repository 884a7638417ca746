"""The tokenizer of text calibration: tokenizer.json beside the model, in a folder, or a hub name's copy
in the local Hugging Face cache (nothing is downloaded); texts tokenized ModelOpt-style."""
from __future__ import annotations

import os
import re

import numpy as np

from messages import CalibError, note
from model_feeds import genai_config, read_json


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

"""Calibration texts: ModelOpt's datasets through `datasets` (offline), the project's corpus as the
fallback, a .txt / .jsonl / .parquet file, and a .txt file as one token stream cut into windows."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np

from messages import CalibError, warn
from text_tokenizer import TextTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_PY = os.path.join(os.path.dirname(HERE), "tools", "corpus.py")

# ModelOpt's GenAI example (examples/windows/onnx_ptq/genai_llm/quantize.py): name -> (path, config, split, column)
HF_DATASETS = {
    "cnn": ("abisee/cnn_dailymail", "3.0.0", "train", "article"),
    "pilevel": ("mit-han-lab/pile-val-backup", None, "validation", "text"),
}


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

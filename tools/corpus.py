#!/usr/bin/env python3
"""English prose corpus for calibration and perplexity, available offline.

Source: The Jargon File 4.4.7 (Eric S. Raymond et al., public domain), as shipped by the
Debian package `jargon-text` (/usr/share/doc/jargon-text/jargon.txt.gz, installed by
scripts/setup). About 240k words of informal English prose: the introductory chapters,
~2,300 lexicon entries (a few sentences to a few paragraphs each) and the appendices
(Hacker Folklore, A Portrait of J. Random Hacker).

The text is cut into documents (one per lexicon entry, one per chapter/appendix section);
tables, the table of contents, the revision history, the pronunciation guide and the
bibliography are dropped, `{cross-references}` lose their braces. Each document goes to ONE
split, chosen by a hash of its title (sha1, ~20% eval), so the splits never overlap and do not
depend on anything but the file: same file -> same splits, on every machine.

    from corpus import calibration_texts, eval_texts, eval_stream
    calibration_texts()      # list[str], calibration split, packed to >= 2000 chars each
    eval_texts()             # list[str], eval split, one document each
    eval_stream()            # str, the eval documents in file order joined by blank lines
    split_stream("calib")    # str, the same for either split

CLI:  python tools/corpus.py --stats
      python tools/corpus.py --split calib --jsonl out.jsonl   # {"text": ...} per line
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
from functools import lru_cache

DEFAULT_PATH = "/usr/share/doc/jargon-text/jargon.txt.gz"
EVAL_PERCENT = 20  # share of documents (by title hash) in the eval split

_SKIP_SECTIONS = ("Revision History", "Pronunciation Guide", "Bibliography")
_BOX = re.compile(r"[\u2500-\u257f]")           # box-drawing characters (tables, rules)
_ENTRY = re.compile(r"^   :(.+?):(.*)$")       # "   :headword: pronunciation, pos."
_XREF = re.compile(r"\{([^{}]*)\}")


class CorpusMissing(RuntimeError):
    pass


def corpus_path() -> str:
    return os.environ.get("NIBBLE_CORPUS", DEFAULT_PATH)


def _read_lines(path: str) -> list[str]:
    if not os.path.exists(path):
        raise CorpusMissing(
            f"corpus file {path} not found: install the Debian package 'jargon-text' "
            f"(scripts/setup does) or set NIBBLE_CORPUS to a jargon.txt[.gz]")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _paragraphs(lines: list[str]) -> str:
    """Indented, hard-wrapped lines -> paragraphs joined by blank lines."""
    paras, cur = [], []
    for ln in lines:
        if _BOX.search(ln):
            continue
        s = ln.strip()
        if not s:
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(s)
    if cur:
        paras.append(" ".join(cur))
    text = "\n\n".join(paras)
    text = _XREF.sub(r"\1", text).replace("\u00a0", " ")
    return text.strip()


@lru_cache(maxsize=4)
def documents(path: str | None = None) -> tuple[tuple[str, str], ...]:
    """All documents in file order, as (title, text)."""
    lines = _read_lines(path or corpus_path())
    docs: list[tuple[str, str]] = []

    def flush(title, body):
        if title is None or any(k in title for k in _SKIP_SECTIONS):
            return
        text = _paragraphs(body)
        if len(text) >= 40:
            docs.append((title.replace("\u00a0", " "), text))

    title, body = None, []
    in_glossary = False
    in_index = False  # the per-letter headword lists inside the glossary
    for ln in lines:
        if ln and not ln.startswith(" ") and not _BOX.search(ln[:1]):
            # top-level heading: chapter, section, appendix, "Glossary"
            flush(title, body)
            title, body = ln.strip(), []
            in_glossary = title == "Glossary"
            in_index = in_glossary
            if in_glossary:
                title = None
            continue
        if in_glossary:
            m = _ENTRY.match(ln)
            if m:
                flush(title, body)
                title, body = m.group(1).strip(), []
                in_index = False
                continue
            if re.match(r"^  \S", ln):  # letter header, followed by an index of headwords
                flush(title, body)
                title, body = None, []
                in_index = True
                continue
            if in_index:
                continue
        if title is not None:
            body.append(ln)
    flush(title, body)
    # The first top-level block is the title page + table of contents: never a heading
    # we keep (it has no title line of its own), so nothing to drop here.
    return tuple(docs)


def _is_eval(title: str) -> bool:
    h = int.from_bytes(hashlib.sha1(title.encode("utf-8")).digest()[:4], "big")
    return h % 100 < EVAL_PERCENT


def split_documents(split: str, path: str | None = None) -> list[tuple[str, str]]:
    if split not in ("calib", "eval"):
        raise ValueError(f"split must be 'calib' or 'eval', not {split!r}")
    want_eval = split == "eval"
    return [d for d in documents(path) if _is_eval(d[0]) == want_eval]


def _doc_text(title: str, text: str) -> str:
    # Lexicon entries read as "headword: definition"; sections keep their title as a line.
    return f"{title}\n\n{text}"


def eval_texts(path: str | None = None) -> list[str]:
    return [_doc_text(t, x) for t, x in split_documents("eval", path)]


def eval_stream(path: str | None = None) -> str:
    return "\n\n".join(eval_texts(path))


def split_stream(split: str, path: str | None = None) -> str:
    """Either split's documents in file order joined by blank lines (eval_stream for "eval"). The
    calibration split is held-out text for a method that reads no calibration data (RTN, HQQ)."""
    return "\n\n".join(_doc_text(t, x) for t, x in split_documents(split, path))


def calibration_texts(n: int | None = None, min_chars: int = 2000,
                      path: str | None = None) -> list[str]:
    """Calibration split, consecutive documents packed into texts of >= min_chars."""
    out, cur, size = [], [], 0
    for t, x in split_documents("calib", path):
        d = _doc_text(t, x)
        cur.append(d)
        size += len(d) + 2
        if size >= min_chars:
            out.append("\n\n".join(cur))
            cur, size = [], 0
            if n is not None and len(out) >= n:
                return out
    if cur and (n is None or len(out) < n):
        out.append("\n\n".join(cur))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default=None, help=f"corpus file (default {DEFAULT_PATH})")
    ap.add_argument("--stats", action="store_true", help="print sizes of both splits")
    ap.add_argument("--split", choices=["calib", "eval"], help="split to write")
    ap.add_argument("--jsonl", help="write the split as JSON lines {\"text\": ...}")
    ap.add_argument("--min_chars", type=int, default=2000, help="calibration packing size")
    a = ap.parse_args(argv)
    try:
        if a.stats or not a.split:
            for s in ("calib", "eval"):
                ds = split_documents(s, a.path)
                words = sum(len(x.split()) for _, x in ds)
                print(json.dumps({"split": s, "documents": len(ds), "words": words,
                                  "chars": sum(len(x) for _, x in ds)}))
        if a.split:
            texts = (calibration_texts(min_chars=a.min_chars, path=a.path)
                     if a.split == "calib" else eval_texts(a.path))
            f = open(a.jsonl, "w", encoding="utf-8") if a.jsonl else sys.stdout
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
            if a.jsonl:
                f.close()
    except CorpusMissing as e:
        print(f"corpus: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

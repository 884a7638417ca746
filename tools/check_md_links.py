#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown files: every file a link names exists, and every
`#anchor` names a heading of the file it points into (GitHub's anchors: the heading's text lower-cased,
punctuation dropped, spaces as hyphens, `-1`, `-2`, ... for repeats). Web links are not followed.

    python3 tools/check_md_links.py             # every tracked *.md; prints each broken link, exit 1 if any
    python3 tools/check_md_links.py FILE.md ...

Also importable: `slug(heading)`, `anchors(path)`, `broken_links(paths)`, `table_cells(path)`.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[([^\]]+)\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (without the leading #'s)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link counts by its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def prose_lines(path: str):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line.rstrip("\n")


def anchors(path: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(2))
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.add(s if k == 0 else f"{s}-{k}")
    return out


def links(path: str):
    """(line number, target) of every link in the file's prose: inline links and reference definitions."""
    for n, line in prose_lines(path):
        if line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|", "[")):
            continue  # an indented code block (commands), not prose
        m = REF_DEF.match(line)
        if m:
            yield n, m.group(2)
            continue
        for t in INLINE_LINK.finditer(CODE_SPAN.sub("", line)):
            yield n, t.group(1)


def broken_links(paths) -> list[str]:
    cache: dict[str, set[str]] = {}
    bad = []
    for path in paths:
        for n, target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{os.path.relpath(path, ROOT)}:{n}: {target}"
            if not os.path.exists(dest):
                bad.append(f"{where}: no such file")
                continue
            if anchor and dest.endswith(".md"):
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    bad.append(f"{where}: no heading with that anchor in {os.path.relpath(dest, ROOT)}")
    return bad


def table_cells(path: str):
    """(line number, cell text) of every cell of the file's Markdown tables (separator rows left out)."""
    for n, line in prose_lines(path):
        s = line.strip()
        if not (s.startswith("|") and s.endswith("|")) or re.fullmatch(r"[|:\- ]+", s):
            continue
        cells = re.split(r"(?<!\\)\|", s[1:-1])
        for c in cells:
            yield n, c.strip()


def tracked_markdown() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "*.md"], cwd=ROOT, capture_output=True, check=True).stdout
    return [os.path.join(ROOT, p) for p in out.decode().split("\0") if p]


def main(argv: list[str]) -> int:
    paths = [os.path.abspath(p) for p in argv] or tracked_markdown()
    bad = broken_links(paths)
    for b in bad:
        print(b)
    print(f"{len(paths)} Markdown files, {len(bad)} broken links", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

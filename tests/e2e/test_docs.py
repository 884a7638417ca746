"""The Markdown files read as documents: every relative link resolves (tools/check_md_links.py), and the
README and the results stay short enough to read (README <= 200 lines and no table cell over 40 words,
bench/RESULTS.md <= 300 lines, docs/status.md's cells <= 40 words). No binary needed."""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import check_md_links  # noqa: E402


def words(cell: str) -> int:
    """Words as read: a link counts by its text, not its target."""
    return len(re.sub(r"\]\([^)]*\)", "]", cell).split())


def line_count(rel: str) -> int:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_relative_links_resolve():
    bad = check_md_links.broken_links(check_md_links.tracked_markdown())
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_readme_is_short_and_keeps_the_test_command():
    assert line_count("README.md") <= 200
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert re.search(r"^\s+scripts/test\b", text, re.M), "the README's test command (.ci/run runs it) is missing"


def test_table_cells_are_short():
    for rel in ("README.md", "docs/status.md"):
        long = [(n, words(c)) for n, c in check_md_links.table_cells(os.path.join(ROOT, rel)) if words(c) > 40]
        assert not long, f"{rel}: table cells over 40 words (line, words): {long}"


def test_results_is_current_tables_only():
    assert line_count("bench/RESULTS.md") <= 300

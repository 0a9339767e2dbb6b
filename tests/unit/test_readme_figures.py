"""The README's figures are docs/benchmarks.md's (issue 45, item 12: the README quoted a wall-clock replay
that docs/replay.md had replaced). Every figure in "How it measures up" is anchored to a key of the table
"The figures the README quotes", and says what that row says."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANCHOR = re.compile(r"<!--fig:([a-z0-9-]+)-->(.*?)<!--/fig-->", re.S)


def _table() -> dict[str, str]:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text.split("## The figures the README quotes", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    table = {cells[0].strip(): cells[1].strip() for cells in rows if cells[0].strip() not in ("key", "---")}
    assert all(row[3].strip() for row in rows), "every figure has its command (or 'the same')"
    return table


def _section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## How it measures up", 1)[1].split("\n## ", 1)[0]


def test_every_figure_the_readme_quotes_is_the_benchmarks_tables():
    table, section = _table(), _section()
    quoted = ANCHOR.findall(section)
    assert quoted, "the README quotes no anchored figure"
    wrong = [(key, value, table.get(key)) for key, value in quoted if table.get(key) != value.strip()]
    assert wrong == [], f"README figure differs from docs/benchmarks.md (key, README, table): {wrong}"


def test_no_figure_in_the_readme_is_left_unanchored():
    """A number with a unit or a sign (0.88 s, +9.0%, 25.9 s) outside an anchor is a figure nobody checks."""
    bare = ANCHOR.sub("", _section())
    loose = re.findall(r"[+-]?\d+(?:\.\d+)?\s?(?:%|s\b|ms\b)", bare)
    assert loose == [], f"figures in the README without a key in docs/benchmarks.md: {loose}"

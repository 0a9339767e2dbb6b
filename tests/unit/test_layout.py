"""The code's shape, held: the core's layers drawn from its imports (no arrow up, no circle), modules of
one idea (none over 400 lines without its reason at its top, no function over 80 lines), and
docs/layout.md naming every module of the tree as the tree describes it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.layout import REPO, documented, generated, graph, parsed

# The core's floors, lowest first: a module may import its own floor and those below, never above. Within
# the domain the wings stand on the shared modules at its root, and on each other in this order only.
FLOORS = (
    "spotguard.domain",  # the shared few: errors, envelope, tasks, checkpoints, manifest, prices, clock ...
    "spotguard.domain.capacity",
    "spotguard.domain.pools",
    "spotguard.domain.interruption",
    "spotguard.domain.jobs",
    "spotguard.ports",
    "spotguard.usecases",
    "spotguard.adapters",
    "spotguard.runtime",
)


def floor(module: str) -> int:
    """The highest floor whose name is the module or a package above it."""
    return max(i for i, f in enumerate(FLOORS) if module == f or module.startswith(f + "."))


def test_no_arrow_of_the_core_runs_up_a_floor():
    up = [
        f"{a} ({FLOORS[floor(a)]}) -> {b} ({FLOORS[floor(b)]})"
        for a, targets in graph().items()
        if a != "spotguard"
        for b in targets
        if b != "spotguard" and floor(b) > floor(a)
    ]
    assert up == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_core_has_no_circle_of_imports():
    assert _cycles(graph()) == []


def test_a_circle_is_found_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ------------------------------------------------------------------------------------- sizes
ROOTS = ("layers/core/spotguard", "cli/spotguard_cli", "agent/spotguard_agent", "functions")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# A module may be longer when its docstring says why, in a sentence that begins so.
REASON = re.compile(r"Over 400 lines:")


def _sources() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))


def test_no_module_is_over_400_lines_without_its_reason():
    long = []
    for path in _sources():
        lines = path.read_text().count("\n")
        if lines > MAX_MODULE_LINES and not REASON.search(ast.get_docstring(parsed(path)) or ""):
            long.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert long == []


def test_no_function_is_over_80_lines():
    long = []
    for path in _sources():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert long == []


# ---------------------------------------------------------------------------------------- docs
def test_docs_layout_names_every_module_as_the_tree_describes_it():
    """Run `.venv/bin/python -m tests.layout --write` after adding, moving or re-describing a module."""
    assert documented() == generated(), "docs/layout.md is stale: .venv/bin/python -m tests.layout --write"


# --------------------------------------------------------------------------------------- the suite
# tests/unit is the pure part of the suite (make check runs it first): the core on its fakes and the CLI's
# own logic, with no AWS (no moto, no botocore Stubber, no boto3 client) and no process started. A test
# that needs any of those belongs in tests/contract (a port's adapter) or tests/integration.
IMPURE = ("moto", "boto3", "botocore", "subprocess")


def test_the_unit_tests_touch_no_aws_and_start_no_process():
    found = []
    for path in sorted((REPO / "tests" / "unit").glob("*.py")):
        for node in ast.walk(parsed(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in IMPURE]
    assert found == []

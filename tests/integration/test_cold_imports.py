"""What the functions load at a cold start: numpy (the capacity planner's) only at the first decision,
since most task events and manual invocations decide nothing; and nothing of the pools in the
interruption function, which needs them at a rebalance recommendation only. And what the CLI loads to
start: neither numpy nor matplotlib, which only simulate, the replay and the plots use."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def cold(code: str, *more: str) -> str:
    """What `code` prints in a fresh interpreter that sees only the core layer (and the directories
    `more`, relative to the repository)."""
    path = [str(REPO / "layers" / "core"), *(str(REPO / m) for m in more)]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": os.pathsep.join(path), "PATH": "/usr/bin:/bin"},
    )
    return out.stdout.strip()


def test_the_jobs_wiring_loads_no_numpy_until_a_decision():
    code = (
        "import sys; import spotguard.runtime.jobs, spotguard.usecases.jobs.reconcile; "
        "print('numpy' in sys.modules)"
    )
    assert cold(code) == "False"


def test_the_interruption_function_loads_nothing_of_the_pools_or_checkpoints_at_a_cold_start():
    code = (
        "import sys; import spotguard.runtime.interruption; "
        "print(sorted(m for m in sys.modules if m.startswith(('spotguard.domain.pools', "
        "'spotguard.usecases.pools', 'spotguard.adapters.pool_store', 'spotguard.domain.checkpoints', "
        "'spotguard.domain.manifest'))))"
    )
    assert cold(code) == "[]"


HEAVY = "print(sorted(m for m in ('numpy', 'matplotlib', 'spotguard_cli.simulator') if m in sys.modules))"


def test_the_cli_builds_its_parser_without_numpy_or_matplotlib():
    """`spotguard --help`, `local --help` and every command's parser: the simulator (numpy) and the plots
    (matplotlib) are imported by the commands that run them, when they run."""
    code = f"import sys; import spotguard_cli.main as m; m.build_parser(); {HEAVY}"
    assert cold(code, "cli") == "[]"


EVENTS = sorted(str(p) for p in (REPO / "events" / "eventbridge").glob("*.json"))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["local", "--help"],
        ["local", "replay", "--help"],
        ["jobs", "--help"],
        ["explain", *EVENTS],
    ],
    ids=["help", "local help", "replay help", "jobs help", "explain every sample"],
)
def test_the_cli_commands_that_neither_simulate_nor_plot_load_no_numpy(argv):
    code = (
        "import contextlib, io, sys; from spotguard_cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})\n"
        f"{HEAVY}"
    )
    assert cold(code, "cli") == "[]"


def _imports(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of `package` (under `root`) and the modules of the package it imports, at its top or
    inside a function."""
    modules = {}
    for f in (root / package).rglob("*.py"):
        parts = f.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for m, f in modules.items():
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            edges[m] |= {t for n in names if (t := module_of(n)) and t != m}
    return edges


def test_the_cli_modules_import_one_another_without_a_circle():
    """The local demo and the capacity demo once imported each other; no module of the CLI reaches
    itself again through what it imports."""
    edges = _imports(REPO / "cli", "spotguard_cli")
    circles = []
    for start in edges:
        seen, todo = set(), list(edges[start])
        while todo:
            m = todo.pop()
            if m == start:
                circles.append(start)
                break
            if m not in seen:
                seen.add(m)
                todo += edges[m]
    assert circles == []

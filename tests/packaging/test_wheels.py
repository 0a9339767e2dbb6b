"""The two wheels hold every module of their source trees.

A hand-made package list once left out spotguard_cli.replay, and every command of the installed CLI
failed on import. .ci/run also installs both wheels into a fresh environment and runs the first commands
(.ci/wheel-smoke); this test is the fast half of that: what the wheel holds, built without isolation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _build(project: Path, parts: list[str], tmp: Path) -> Path:
    """Builds from a copy of the project's files, so no build/ left in the clone can fill a gap."""
    src = tmp / "src"
    for part in parts:
        if (project / part).is_dir():
            shutil.copytree(project / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(project / part, src / part)
    out = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _sources(root: Path, package: str) -> set[str]:
    top = root / package
    return {
        f"{package}/{p.relative_to(top).as_posix()}"
        for p in top.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def _modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if n.endswith(".py")}


def test_the_spotguard_wheel_holds_every_module_of_the_core_and_the_cli(tmp_path: Path) -> None:
    held = _modules(
        _build(ROOT, ["pyproject.toml", "VERSION", "LICENSE", "README.md", "layers/core", "cli"], tmp_path)
    )
    expected = _sources(ROOT / "layers" / "core", "spotguard") | _sources(ROOT / "cli", "spotguard_cli")
    assert expected - held == set()
    assert "spotguard_cli/local/replay/command.py" in held


def test_the_agent_wheel_holds_every_module_of_the_agent(tmp_path: Path) -> None:
    held = _modules(_build(ROOT / "agent", ["pyproject.toml", "VERSION", "spotguard_agent"], tmp_path))
    assert _sources(ROOT / "agent", "spotguard_agent") - held == set()

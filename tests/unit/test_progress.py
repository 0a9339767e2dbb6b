"""Progress on stderr (spotguard_cli.progress): only on a terminal, never with --json, never on stdout."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from spotguard_cli import progress as progress_module
from spotguard_cli import simulate as simulate_module
from spotguard_cli.main import main
from spotguard_cli.progress import NoBar, echo, progress


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with progress(5, "work") as bar:
        bar.update(5)
    assert isinstance(bar, NoBar) and bar.n == 5
    assert capsys.readouterr() == ("", "")
    piped = io.StringIO()
    with progress(5, "work", stream=piped) as bar:
        bar.update()
    assert isinstance(bar, NoBar) and piped.getvalue() == ""


def test_no_bar_when_the_caller_wants_machine_output(capsys):
    tty = FakeTTY()
    with progress(5, "work", enabled=False, stream=tty) as bar:  # e.g. --json
        bar.update(2)
    assert isinstance(bar, NoBar) and tty.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_a_terminal_gets_the_bar_and_stdout_nothing(capsys):
    tty = FakeTTY()
    with progress(4, "work", stream=tty, unit="run") as bar:
        assert not isinstance(bar, NoBar)
        bar.update(2)
        bar.refresh()
        shown = tty.getvalue()
    assert "work" in shown and "2/4" in shown and "run" in shown
    assert "<" in shown  # elapsed<left: the estimate of the time left
    assert capsys.readouterr().out == ""


def test_a_stream_without_isatty_or_closed_gets_no_bar():
    closed = FakeTTY()
    closed.close()
    assert isinstance(progress(1, "x", stream=closed), NoBar)
    assert isinstance(progress(1, "x", stream=object()), NoBar)  # type: ignore[arg-type]


def test_echo_prints_what_print_would(capsys):
    echo("a line", flush=True)
    with progress(3, "work", stream=FakeTTY()) as bar:  # a bar up: tqdm is loaded, echo goes through it
        echo("another")
        echo()
        bar.update()
    assert capsys.readouterr().out == "a line\nanother\n\n"


# ------------------------------------------------------------------------- spotguard simulate


def write(path: Path, data: list[int]) -> str:
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": data}))
    return str(path)


@pytest.fixture
def argv(tmp_path: Path) -> list[str]:
    a = write(tmp_path / "a.json", [1, 1, 0, 0, 1, 1, 1, 0] * 6)
    b = write(tmp_path / "b.json", [0, 1, 1, 1, 1, 0, 0, 1] * 6)
    args = ["--job-hours", "4", "--deadline-hours", "8", "--restart-hours", "0.5", "--seed", "3"]
    # 2 traces x 5 starts: 10 runs a policy, enough for the process pool
    return ["simulate", "--policy", "greedy", "--policy", "spotguard", "--trace", a, "--trace", b, *args]


@pytest.fixture
def bars(monkeypatch) -> list:
    """Every bar simulate asks for."""
    made: list = []

    def spy(*args, **kwargs):
        bar = progress_module.progress(*args, **kwargs)
        made.append(bar)
        return bar

    monkeypatch.setattr(simulate_module, "progress", spy)
    return made


def test_simulate_json_is_the_same_with_and_without_a_terminal(argv, monkeypatch, capsys, bars):
    monkeypatch.setattr(simulate_module, "time", SimpleNamespace(monotonic=lambda: 0.0))  # "seconds": 0
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main([*argv, "--samples", "5", "--json"]) == 0
    piped = capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main([*argv, "--samples", "5", "--json"]) == 0
    tty = capsys.readouterr()
    assert (
        tty.out == piped.out and len(json.loads(tty.out)) == 2 and tty.err == piped.err == ""
    )  # --json: no bar
    assert all(isinstance(b, NoBar) and b.n == 20 for b in bars)


# It renders a plot: matplotlib's first figure in a process costs about 2 s of CPU, so in the whole suite
# (one process) this test went over the 2 s bound of tests not marked slow (2.94 s, 2.35 s in two CI runs).
@pytest.mark.slow
def test_simulate_shows_progress_on_a_terminal_and_the_same_table(argv, tmp_path, monkeypatch, capsys, bars):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main([*argv, "--samples", "5"]) == 0
    piped = capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    png = tmp_path / "cost.png"
    assert main([*argv, "--samples", "5", "--plot", str(png)]) == 0
    tty = capsys.readouterr()
    assert tty.out == piped.out and piped.err == ""
    assert "simulate" in tty.err and "plot" in tty.err and tty.err.endswith(f"plot written to {png}\n")
    simulated, plotted = bars[1:]  # after the piped run's one
    assert not isinstance(simulated, NoBar) and simulated.n == simulated.total == 20  # every run counted
    assert plotted.n == plotted.total > 20

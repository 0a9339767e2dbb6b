"""Any end of `local run`, `local up` and the demos stops every process it started, by id (issue 45, item
10: `local run` killed by SIGTERM left its moto server running, reparented to init, for half an hour)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each starts the local stack


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def _descendants(pid: int) -> list[int]:
    children, found, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


SLEEPER = ["python", "-c", "import time; time.sleep(120)"]


@pytest.mark.parametrize(
    ("argv", "sig", "processes"),
    [
        (["local", "run", "--interrupt-at", "60", "--", *SLEEPER], "SIGTERM", 2),  # moto server, the task
        (["local", "up", "--instances", "1"], "SIGHUP", 1),  # moto server; no job submitted
        (["local", "demo"], "SIGTERM", 2),  # moto server, the training, its reference
    ],
    ids=["run-SIGTERM", "up-SIGHUP", "demo-SIGTERM"],
)
def test_a_local_command_ended_by_a_signal_leaves_no_process_behind(
    tmp_path: Path, argv: list[str], sig: str, processes: int
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotguard_cli.main", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # moto server and a task (or the training) running
            started = _descendants(proc.pid)
            lines = [_cmdline(p) for p in started]
            if any("motopatch" in c for c in lines) and len(started) >= processes:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        time.sleep(1.0)
        started = _descendants(proc.pid)
        assert any("motopatch" in _cmdline(p) for p in started)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + getattr(signal, sig) or (argv[1] == "up" and proc.returncode == 0), (
            err
        )
        time.sleep(0.5)
        left = [f"{p}: {_cmdline(p)}" for p in started if _alive(p)]
        assert left == [], left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in started:  # what the test found, by id, whoever it was left to
            if _alive(p):
                os.kill(p, signal.SIGKILL)

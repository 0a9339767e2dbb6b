"""Run the example torchrun jobs as SpotGuard runs them (`spotguard-agent run -- torchrun ...` as the
container's first process, signalled as ECS signals it) and read what they did. Shared by
tests/agent/test_torchrun.py (2 ranks, gloo, CPU) and bench/gpu_check.py (the same on a GPU)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
DDP = EXAMPLES / "train_ddp.py"
FSDP = EXAMPLES / "train_fsdp.py"
STEPS = 40
EXIT_RE = re.compile(r"checkpointed after step (\d+): exit 75")
TIMEOUT = 300  # seconds for one run: a hung rank fails the check instead of holding it


def job_env(store: Path, **extra: str) -> dict[str, str]:
    """The environment of a job checkpointing to file://`store`: no AWS or SpotGuard settings from
    outside, no instance metadata."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTGUARD_"))}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        SPOTGUARD_WATCH_METADATA="false",
        SPOTGUARD_JOB_ID="j-ranks",
        SPOTGUARD_CHECKPOINT_URI=f"file://{store}/",
        OMP_NUM_THREADS="1",
        **extra,
    )
    return env


def torchrun(script: Path, ranks: int, out: Path, *args: str, steps: int = STEPS) -> list[str]:
    return launch(script, ranks, "--steps", str(steps), "--out", str(out), *args)


def launch(script: Path, ranks: int, *args: str) -> list[str]:
    """torchrun's command line: `script` with `args` in `ranks` processes of this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        str(script),
        *args,
    ]


def wrapped(cmd: list[str]) -> list[str]:
    """`cmd` under the agent's wrapper, as the container's first process."""
    return [sys.executable, "-m", "spotguard_agent.wrapper", "run", "--", *cmd]


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `cmd` to its end; one still running TIMEOUT seconds after its start is killed with the
    processes it started (its exit status then says so)."""
    proc = start(cmd, env)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill(proc)
        out, err = proc.communicate()
        err += f"\n(killed after {TIMEOUT} s)"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`cmd` in a process group of its own (torchrun and its ranks with it), for `kill`."""
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def kill(proc: subprocess.Popen[str]) -> None:
    """`proc` and every process it started (they hold its output open)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def read_until(proc: subprocess.Popen[str], pattern: str) -> None:
    """Read the job's output up to a line matching `pattern`; AssertionError if it ends first."""
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.strip())
        if re.fullmatch(pattern, line.strip()):
            return
    raise AssertionError(
        f"ended before {pattern!r}: {lines[-5:]} {proc.stderr.read()[-3000:] if proc.stderr else ''}"
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def signalled(
    cmd: list[str], env: dict[str, str], after_step: int, sig: signal.Signals
) -> tuple[int, str, str]:
    """Start `cmd`, send `sig` to it once it has printed step `after_step`, and wait for its end. One not
    ended TIMEOUT seconds after its start is killed with the processes it started (the read or the
    wait then fails)."""
    proc = start(cmd, env)
    watchdog = threading.Timer(TIMEOUT, kill, args=(proc,))
    watchdog.start()
    try:
        read_until(proc, rf"step {after_step} loss .*")
        proc.send_signal(sig)
        return finish(proc)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill(proc)
            proc.wait()


def same_weights(a: Path, b: Path) -> bool:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)

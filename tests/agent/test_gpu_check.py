"""bench/gpu_check.py, the agent's checks for a GPU machine, rehearsed on the CPU: the script a GPU
session runs once, in minutes of borrowed time, must not first fail there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from ..conftest import REPO

pytestmark = pytest.mark.slow  # figures of a small state and six torchrun jobs


def test_the_gpu_checks_run_through_on_the_cpu_and_say_each_check_and_goal():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTGUARD_"))}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--rehearse", "--sizes", "0.01"],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "SIGTERM commit to file://" in out and "snapshot (reused buffers)" in out
    assert out.count("goal 0.01 GiB:") == 2  # the snapshot's and the restore's goals, met or missed
    assert "restore into the state there (file://)" in out
    assert "0.01 GiB: SIGTERM commit / parallel writers x" in out  # said, but the goal is 13.5 GiB's
    assert out.count("  ok     ") == 3 and "0 check(s) failed" in out


def test_without_a_gpu_it_says_so_in_one_line():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--only", "figures"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no CUDA device here (--rehearse runs the same checks on the CPU)" in done.stderr


# a first process whose child holds the output open: killing the first alone would leave the read waiting
# for the child's minute
HANGS = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
)


@pytest.mark.parametrize("helper", ["signalled", "run"])
def test_a_job_past_its_time_is_killed_with_the_processes_it_started(monkeypatch, helper):
    import signal
    import time

    from bench import torchrun_jobs

    monkeypatch.setattr(torchrun_jobs, "TIMEOUT", 1)
    cmd, started = [sys.executable, "-c", HANGS], time.monotonic()
    if helper == "signalled":  # it never prints the step to signal it after
        with pytest.raises(AssertionError, match="ended before"):
            torchrun_jobs.signalled(cmd, dict(os.environ), 5, signal.SIGTERM)
    else:
        done = torchrun_jobs.run(cmd, dict(os.environ))
        assert done.returncode != 0 and "killed after 1 s" in done.stderr
    assert time.monotonic() - started < 20


def test_the_commits_goal_is_the_large_states_and_the_snapshots_every_states(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import gpu_check
    import torch

    def figures(gib: float, snapshot: float, commit: float, restore: float = 0.9) -> dict[str, float]:
        return {
            "bytes": gib * 1024**3,
            "link_gbps": 50.0,
            "snapshot_gbps": 50.0 * snapshot,
            "commit_s": commit,
            "limit_s": 1.0,
            "to_device_gbps": 20.0,
            "restore_s": gib * 1024**3 / 1e9 / (20.0 * restore),
        }

    measured = [figures(1, 0.9, 2.5), figures(13.5, 0.9, 1.1), figures(13.5, 0.7, 1.3, restore=0.5)]
    monkeypatch.setattr(gpu_check, "hardware_main", lambda sizes, device, root: measured)
    missed = gpu_check.figures([1, 13.5, 13.5], torch.device("cpu"), REPO)
    # the small state's slow commit is said, not missed; the large state's is a goal
    assert missed == [
        "13.50 GiB snapshot / one pinned copy x0.70",
        "13.50 GiB restore to the device / one pinned copy x0.50",
        "13.50 GiB SIGTERM commit / parallel writers x1.30",
    ]
    out = capsys.readouterr().out
    assert "1.00 GiB: SIGTERM commit / parallel writers x2.50 (the goal is the 13.5 GiB state's)" in out
    assert out.count(": met") == 5  # 1 GiB's snapshot and restore, the first 13.5 GiB state's three

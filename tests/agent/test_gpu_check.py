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
    assert out.count("goal 0.01 GiB:") == 2  # each goal said, met or missed
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

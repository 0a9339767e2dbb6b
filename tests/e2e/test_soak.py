"""`spotguard local soak` from the command line: jobs through made spot traces (two pools that go away
now and then, together at times) on the virtual clock, with and without faults (task events duplicated and
reordered, instances gone without a warning, a last commit cut by the reclaim, and at SpotGuard's own AWS
calls throttling, 5xx, lost answers, conditional writes raced and invocations cut). Nothing that must never
happen happens, and two runs with one seed print the same result, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.replay_traces import write_traces

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SPOTGUARD = Path(sys.executable).with_name("spotguard")


def _soak(
    tmp: Path,
    traces: tuple[Path, Path],
    seed: int,
    faults: float = 0.0,
    call_faults: float | None = None,
    amis: str = "false",
) -> tuple[dict, str]:
    argv = [str(SPOTGUARD), "local", "soak", "--trace", str(traces[0]), "--trace", str(traces[1])]
    argv += ["--jobs", "8", "--job-hours", "3", "--hours", "12", "--seed", str(seed), "--json"]
    argv += ["--faults", str(faults)]
    argv += [] if call_faults is None else ["--call-faults", str(call_faults)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # the command sets its own
    env["MOTO_EC2_LOAD_DEFAULT_AMIS"] = amis  # tests/conftest.py turns them off; a user's shell does not
    done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    logs = tmp / ".local-stack" / "soak"
    # the functions' log too: Powertools' stamps on the virtual clock (issue 45, item 11)
    return json.loads(done.stdout), (logs / "timeline.log").read_text() + (logs / "functions.log").read_text()


def _nothing_lost(result: dict) -> None:
    assert result["ok"] and result["jobs"] == 8 and result["interruptions"] > 0
    assert result["succeeded"] + result["unfinished"] + result["cancelled"] == 8
    assert result["succeeded"] >= 2 and result["succeeded"] + result["cancelled"] >= 4
    assert result["cancels_undone"] == []
    assert (result["lost"], result["twice_at_once"], result["steps_lost"]) == ([], [], 0)
    assert (result["dead_letters"], result["stuck"], result["denied"]) == (0, [], [])


def test_a_soak_under_faults_loses_nothing_and_repeats_exactly(tmp_path: Path):
    traces = write_traces(tmp_path)
    # faults in the world at 0.3; at SpotGuard's calls (thousands) at 0.05
    first, timeline = _soak(tmp_path, traces, seed=7, faults=0.3, call_faults=0.05)
    _nothing_lost(first)
    kinds = ("duplicated", "reordered", "no-warning", "commit-cut", "lost-running", "cancelled")
    kinds += ("throttle-once", "throttle-exhaust")
    kinds += ("5xx-once", "5xx-exhaust", "lost", "lost-retried", "race", "cut")
    assert sorted(first["faults"]) == sorted(kinds)
    assert all(n > 0 for n in first["faults"].values()), first["faults"]  # every kind of fault was played
    assert "fault: cut at " in timeline and "exited 75" in timeline
    assert "cut mid-commit" in timeline and "resumes from step" not in timeline  # from the manifest before
    # issue 45, items 1 and 2: a RUNNING event lost for good, and a user's cancel (its StopTask faulted or
    # not) end as they must: the job running, then cancelled
    assert "RUNNING event (version" in timeline and "lost" in timeline
    assert first["cancelled"] > 0 and "cancelled by its user" in timeline
    # the same seed, the environment of a user's shell (moto's EC2 would load its AMIs, drawing ids from the
    # seeded random: it gave another run before the soak turned them off itself)
    second, again = _soak(tmp_path, traces, seed=7, faults=0.3, call_faults=0.05, amis="true")
    assert second == first and again == timeline  # the same seed: the same run, event for event


def test_a_soak_loses_nothing_and_repeats_exactly(tmp_path: Path):
    traces = write_traces(tmp_path)
    first, timeline = _soak(tmp_path, traces, seed=5)
    _nothing_lost(first)
    assert "spot warning" in timeline and "exited 75" in timeline
    second, again = _soak(tmp_path, traces, seed=5)
    assert second == first and again == timeline  # the same seed: the same run, event for event


def test_ctrl_c_ends_a_long_soak_at_its_next_step_with_what_it_found(tmp_path: Path):
    """A long run (the 50-job bench) said nothing until it ended; its line a virtual day now comes at once
    through a pipe, and a first Ctrl-C ends the run between two steps, as if its hours ran out, with the
    counts so far: nothing cut half-way, so nothing lost or stuck."""
    import signal

    traces = write_traces(tmp_path)
    argv = [str(SPOTGUARD), "local", "soak", "--trace", str(traces[0]), "--trace", str(traces[1])]
    argv += ["--jobs", "4", "--job-hours", "60", "--hours", "120", "--seed", "2"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("day 1:"):
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    text = "".join(lines) + out
    hours = float(text.split(" h of traces")[0].rsplit(" ", 1)[-1])
    assert 24 <= hours < 48, text  # ended within the second virtual day, not at 120 h
    assert "(running or waiting when the run was stopped (Ctrl-C))" in text
    assert "  jobs lost                  0" in text and "  jobs stuck                 0" in text
    assert "stopped by the user (Ctrl-C)" in (tmp_path / ".local-stack" / "soak" / "timeline.log").read_text()


def test_a_pools_new_instances_join_after_their_boot_or_never(tmp_path: Path):
    """Spot back is not an instance in the cluster: the group launches, and the instance joins a boot
    later (`--boot-seconds`, the local stack's boot model). A pool whose spot comes back for ten minutes
    at a time, with a 15-minute boot, never gets an instance into the cluster; the jobs run on the
    other pool, nothing lost."""
    traces = write_traces(tmp_path)
    flicker = tmp_path / "pool-f.json"
    flicker.write_text(
        json.dumps({"metadata": {"gap_seconds": 600}, "data": [i % 2 for i in range(4 * 24 * 6)]})
    )
    argv = [str(SPOTGUARD), "local", "soak", "--trace", str(traces[0]), "--trace", str(flicker)]
    argv += [
        "--jobs",
        "3",
        "--job-hours",
        "2",
        "--hours",
        "12",
        "--seed",
        "1",
        "--boot-seconds",
        "900",
        "--json",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout)
    timeline = (tmp_path / ".local-stack" / "soak" / "timeline.log").read_text()
    assert result["ok"] and result["succeeded"] == 3, result
    assert "pool 1: 1 booting instance(s) gone" in timeline and "pool 1: spot back" in timeline
    assert "pool 0: spot back" in timeline and " joins" in timeline
    assert not [line for line in timeline.splitlines() if line.split(" ", 1)[1].startswith("pool 1: i-")]

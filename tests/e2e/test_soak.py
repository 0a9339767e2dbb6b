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
    tmp: Path, traces: tuple[Path, Path], seed: int, faults: float = 0.0, call_faults: float | None = None
) -> tuple[dict, str]:
    argv = [str(SPOTGUARD), "local", "soak", "--trace", str(traces[0]), "--trace", str(traces[1])]
    argv += ["--jobs", "8", "--job-hours", "3", "--hours", "12", "--seed", str(seed), "--json"]
    argv += ["--faults", str(faults)]
    argv += [] if call_faults is None else ["--call-faults", str(call_faults)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # the command sets its own
    done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(done.stdout), (tmp / ".local-stack" / "soak" / "timeline.log").read_text()


def _nothing_lost(result: dict) -> None:
    assert result["ok"] and result["jobs"] == 8 and result["interruptions"] > 0
    assert result["succeeded"] + result["unfinished"] == 8 and result["succeeded"] >= 4
    assert (result["lost"], result["twice_at_once"], result["steps_lost"]) == ([], [], 0)
    assert (result["dead_letters"], result["stuck"], result["denied"]) == (0, [], [])


def test_a_soak_under_faults_loses_nothing_and_repeats_exactly(tmp_path: Path):
    traces = write_traces(tmp_path)
    # faults in the world at 0.3; at SpotGuard's calls (thousands) at 0.05
    first, timeline = _soak(tmp_path, traces, seed=3, faults=0.3, call_faults=0.05)
    _nothing_lost(first)
    kinds = ("duplicated", "reordered", "no-warning", "commit-cut", "throttle-once", "throttle-exhaust")
    kinds += ("5xx-once", "5xx-exhaust", "lost", "lost-retried", "race", "cut")
    assert sorted(first["faults"]) == sorted(kinds)
    assert all(n > 0 for n in first["faults"].values()), first["faults"]  # every kind of fault was played
    assert "fault: cut at " in timeline and "exited 75" in timeline
    assert "cut mid-commit" in timeline and "resumes from step" not in timeline  # from the manifest before
    second, again = _soak(tmp_path, traces, seed=3, faults=0.3, call_faults=0.05)
    assert second == first and again == timeline  # the same seed: the same run, event for event


def test_a_soak_loses_nothing_and_repeats_exactly(tmp_path: Path):
    traces = write_traces(tmp_path)
    first, timeline = _soak(tmp_path, traces, seed=5)
    _nothing_lost(first)
    assert "spot warning" in timeline and "exited 75" in timeline
    second, again = _soak(tmp_path, traces, seed=5)
    assert second == first and again == timeline  # the same seed: the same run, event for event

"""`spotguard local soak` from the command line: jobs through made spot traces (two pools that go away
now and then, together at times) on the virtual clock. Nothing that must never happen happens, and two runs
with one seed print the same result, byte for byte."""

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


def _soak(tmp: Path, traces: tuple[Path, Path], seed: int) -> tuple[dict, str]:
    argv = [str(SPOTGUARD), "local", "soak", "--trace", str(traces[0]), "--trace", str(traces[1])]
    argv += ["--jobs", "8", "--job-hours", "3", "--hours", "12", "--seed", str(seed), "--json"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # the command sets its own
    done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return json.loads(done.stdout), (tmp / ".local-stack" / "soak" / "timeline.log").read_text()


def test_a_soak_loses_nothing_and_repeats_exactly(tmp_path: Path):
    traces = write_traces(tmp_path)
    first, timeline = _soak(tmp_path, traces, seed=5)
    assert first["ok"] and first["jobs"] == 8 and first["interruptions"] > 0
    assert first["succeeded"] + first["unfinished"] == 8 and first["succeeded"] >= 4
    assert (first["lost"], first["twice_at_once"], first["steps_lost"]) == ([], [], 0)
    assert (first["dead_letters"], first["stuck"], first["denied"]) == (0, [], [])
    assert "spot warning" in timeline and "exited 75" in timeline
    second, again = _soak(tmp_path, traces, seed=5)
    assert second == first and again == timeline  # the same seed: the same run, event for event

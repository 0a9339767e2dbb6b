"""`spotguard local demo --scenario gang` as a user runs it: a job of 2 nodes (torchrun under the agent's
wrapper in each, gloo over 127.0.0.1), node 1's instance warned, both nodes checkpointed at one step, the
gang relaunched once from that checkpoint, finished with the weights of an uninterrupted 2-node run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a moto server, the local stack, two nodes' torchruns and a reference


@pytest.mark.alone
def test_the_gang_scenario_as_a_user_runs_it_and_no_process_is_left(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    argv = [sys.executable, "-m", "spotguard_cli.main", "local", "demo", "--scenario", "gang", "--json"]
    argv += ["--steps", "40", "--interrupt-at", "15"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and all(p["passed"] for p in result["proof"]), result["proof"]
    facts = result["facts"]
    assert facts["steps_lost"] == 0 and facts["manifest_ranks"] == [0, 1]
    tasks = [(t["attempt"], t["node"], t["exit_code"]) for t in facts["tasks"]]
    assert tasks == [(1, 0, 75), (1, 1, 75), (2, 0, 0), (2, 1, 0)]
    [(_, step)] = facts["stopped_on"]
    assert 15 <= step < 40 and facts["manifest_step"] == step
    assert (tmp_path / facts["timeline_png"]).stat().st_size > 0
    for pid in facts["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # moto server, every node's first process, the reference's torchruns: all gone

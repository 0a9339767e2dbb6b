"""The README's main command: the demo against moto server on 127.0.0.1, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import REPO


@pytest.mark.slow
def test_the_demo_passes_and_leaves_no_process_behind():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "spotguard_cli.main", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and all(c["passed"] for c in result["checks"])
    assert any("StopTask" in row["what"] for row in result["timeline"])
    pid = result["moto_pid"]
    assert isinstance(pid, int)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the demo stopped the moto server it started

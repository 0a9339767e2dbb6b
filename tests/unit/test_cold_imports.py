"""What the jobs functions load at a cold start: numpy (the capacity planner's) only at the first
decision, since most task events and manual invocations decide nothing."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_jobs_wiring_loads_no_numpy_until_a_decision():
    code = (
        "import sys; import spotguard.runtime.jobs, spotguard.usecases.jobs.reconcile; "
        "print('numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "layers" / "core"), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "False", out.stderr

"""What the functions load at a cold start: numpy (the capacity planner's) only at the first decision,
since most task events and manual invocations decide nothing; and nothing of the pools in the
interruption function, which needs them at a rebalance recommendation only."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def cold(code: str) -> str:
    """What `code` prints in a fresh interpreter that sees only the core layer."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "layers" / "core"), "PATH": "/usr/bin:/bin"},
    )
    return out.stdout.strip()


def test_the_jobs_wiring_loads_no_numpy_until_a_decision():
    code = (
        "import sys; import spotguard.runtime.jobs, spotguard.usecases.jobs.reconcile; "
        "print('numpy' in sys.modules)"
    )
    assert cold(code) == "False"


def test_the_interruption_function_loads_nothing_of_the_pools_or_checkpoints_at_a_cold_start():
    code = (
        "import sys; import spotguard.runtime.interruption; "
        "print(sorted(m for m in sys.modules if m.startswith(('spotguard.domain.pools', "
        "'spotguard.usecases.pools', 'spotguard.adapters.pool_store', 'spotguard.domain.checkpoints', "
        "'spotguard.domain.manifest'))))"
    )
    assert cold(code) == "[]"

"""Fault injection: each AWS call of the interruption path, the stop-to-resubmit path and the checkpoint
path, one at a time, throttled, failing with a 5xx, racing another writer or losing its answer; then SQS
delivers the failed record again (and reconcile runs), and the end state must be the fault-free one:
one task per attempt, the newest checkpoint used, nothing dead-lettered, no job failed, every managed
task stopped exactly once."""

from __future__ import annotations

import pytest

from spotguard_cli.emulator.faults import MAX_ATTEMPTS, Fault
from tests.faults.system import PATHS, FaultWorld, run_case

pytestmark = pytest.mark.slow  # the package's world deploys the stack into moto; each case runs a path


def test_the_end_state_survives_the_fault(fw: FaultWorld, fault_case: tuple[str, str, str]):
    path_name, call, kind = fault_case
    path = PATHS[path_name]
    label, nth = call.rsplit("#", 1)
    fault = Fault(label, int(nth), kind)
    case = run_case(fw, path, fault)
    try:
        assert fault.fired, f"{call} was not made: the path changed since its calls were recorded"
        if kind.endswith("-once"):
            assert fault.attempts == 1
        elif kind.endswith("-exhaust") and fault.attempts != 1:  # RunTask: raised ahead of the retry loop
            assert fault.attempts == MAX_ATTEMPTS, "botocore's standard retry mode did not retry"
        assert fw.dead_letters() == {}, "a record was dead-lettered"
        assert fw.pending() == {}, "records are left on the queues"
        path.check(fw, case)
    finally:
        path.cleanup(fw, case)

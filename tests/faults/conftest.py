"""The fault cases are found by running each path once without a fault and listing its calls (at
collection, in a world of its own), then one case per (path, call, fault kind) runs in a world shared
by the package, each case on a host, job or checkpoint prefix of its own."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from tests.faults.injector import kinds_for
from tests.faults.system import PATHS, FaultWorld, fault_world, record_ops
from tests.integration.conftest import fresh_aws


@functools.cache
def recorded_cases() -> list[tuple[str, str, str]]:
    cases = []
    with fresh_aws(), fault_world() as world:
        for name, path in PATHS.items():
            for call in record_ops(world, path):
                cases += [(name, call.name, kind) for kind in kinds_for(call)]
    return cases


# Defects the cases found (in code this suite does not own): the cases that show them are kept, marked
# xfail(strict=True) with the defect, so that the fix makes them pass (and strict makes them fail
# until the mark is removed). Each has a smaller reproduction in test_defects.py.
NOTICE_FORGETS_TASKS = (
    "defect: after a StopTask that failed and SQS's redelivery, the notice's ledger record (outcome and "
    "task_arns) lists only the tasks the redelivery stopped; a lifecycle action then completes without "
    "waiting for the tasks stopped by the first delivery (test_defects.py::"
    "test_a_lifecycle_action_waits_for_every_task_its_notice_stopped)"
)


# every failure after a StopTask took effect: the redelivery finds the task stopped and records nothing
_AFTER_STOPS = {
    **{
        (f"StopTask#{n}", kind): NOTICE_FORGETS_TASKS
        for n in (1, 2)
        for kind in ("throttle-exhaust", "5xx-exhaust", "lost")
    },
    **{
        ("UpdateItem:ledger:INSTANCE/NOTICE#2", kind): NOTICE_FORGETS_TASKS
        for kind in ("throttle-exhaust", "5xx-exhaust", "lost")
    },
    **{
        ("UpdateItem:idempotency#1", kind): NOTICE_FORGETS_TASKS
        for kind in ("throttle-exhaust", "5xx-exhaust")
    },
}


def known_defect(path: str, call: str, kind: str) -> str | None:
    return _AFTER_STOPS.get((call, kind)) if path == "interruption" else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fault_case" in metafunc.fixturenames:
        params = []
        for path, call, kind in recorded_cases():
            reason = known_defect(path, call, kind)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(
                pytest.param((path, call, kind), marks=marks, id=f"{path}-{call.replace(':', '.')}-{kind}")
            )
        metafunc.parametrize("fault_case", params)


@pytest.fixture(scope="package")
def fw() -> Iterator[FaultWorld]:
    with fresh_aws(), fault_world() as world:
        for path in PATHS.values():  # every per-process cache as warm as when the cases were recorded
            record_ops(world, path)
        yield world

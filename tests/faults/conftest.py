"""The fault cases are found by running each path once without a fault and listing its calls (at
collection, in a world of its own), then one case per (path, call, fault kind) runs in a world shared
by the package, each case on a host, job or checkpoint prefix of its own."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotguard_cli.emulator.faults import kinds_for
from tests.faults.system import PATHS, FaultWorld, fault_world, record_ops
from tests.integration.conftest import fresh_aws


@functools.cache
def recorded_cases() -> list[tuple[str, str, str]]:
    cases = []
    with fresh_aws(), fault_world() as world:
        for name, path in PATHS.items():
            # by name: calls made side by side (a drain beside the stops) come in either order, and
            # every xdist worker must collect the same cases in the same order
            for call in sorted(record_ops(world, path), key=lambda call: call.name):
                cases += [(name, call.name, kind) for kind in kinds_for(call)]
    return cases


# Defects the cases found are kept here, each as the case ids that show it, marked xfail(strict=True) with
# the defect until it is fixed (strict then fails the run until the mark is removed); each has a smaller
# reproduction in tests/integration/test_fault_defects.py. None is open.
KNOWN_DEFECTS: dict[tuple[str, str, str], str] = {}


def known_defect(path: str, call: str, kind: str) -> str | None:
    return KNOWN_DEFECTS.get((path, call, kind))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every case on one xdist worker, one after another (make test's --dist loadgroup): they share the
    package's world (`fw`), built once, which a second world in the same process would collide with."""
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.xdist_group("faults"))


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

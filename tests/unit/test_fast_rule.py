"""tests/conftest.py's 2 s rule measures a fast test's own CPU: the garbage collector's full passes over the
heap the whole suite built (about 0.8 s each late in `make test`) are left out."""

from __future__ import annotations

import contextlib
import gc
import time
from types import SimpleNamespace
from typing import Any

from tests import conftest


def _measured(body: Any) -> float:
    item = SimpleNamespace(stash={})
    wrapper = conftest.pytest_runtest_call(item)  # the hook wrapper around a test's call
    next(wrapper)
    body()
    with contextlib.suppress(StopIteration):
        next(wrapper)
    return float(item.stash[conftest._CPU_USED])


def test_a_full_collection_during_the_call_is_not_the_tests_cpu():
    heap = []
    for _ in range(500_000):  # cycles, built before the call: only a collection pass walks them
        node: list[Any] = []
        node.append(node)
        heap.append(node)
    began = time.process_time()
    spent = _measured(gc.collect)
    collecting = time.process_time() - began
    assert collecting > 0.01 and spent < collecting / 4, (spent, collecting)
    del heap


def test_the_tests_own_work_still_counts():
    def busy() -> None:
        end = time.process_time() + 0.1
        while time.process_time() < end:
            pass

    assert _measured(busy) >= 0.09

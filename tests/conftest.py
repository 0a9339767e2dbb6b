"""Shared fixtures. Tests never reach AWS: fake credentials, no endpoint but moto (in-process or on
127.0.0.1), and a guard that fails any test whose code opens a socket to another address."""

from __future__ import annotations

import gc
import json
import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
EVENTS = REPO / "events" / "eventbridge"

os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "SpotGuard",
        "POWERTOOLS_SERVICE_NAME": "spotguard",
        # moto loads ~1,300 public AMIs into every new EC2 backend (a few tenths of a second per test that
        # deploys the stack); no test reads them: the simulated instances use an AMI id of their own.
        "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
    }
)
os.environ.pop("AWS_ENDPOINT_URL", None)
os.environ.pop("AWS_PROFILE", None)

_real_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    if self.family not in (socket.AF_INET, socket.AF_INET6):
        return _real_connect(self, address)
    host = address[0]
    if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1")):
        raise AssertionError(f"a test tried to reach {address}: tests talk to 127.0.0.1 only")
    return _real_connect(self, address)


socket.socket.connect = _loopback_only  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------ the 2 s rule
# A test not marked slow runs in `make check`, the loop people wait on: its call (the test body, not its
# fixtures) may take at most this long, or it fails and says so. What counts is the CPU the call used (this
# process and the processes it waited for), which another job on a shared machine does not inflate; a call
# that waits (sleeps, a hung server) is caught by its wall time, at three times the bound.
# SPOTGUARD_FAST_TEST_SECONDS sets another bound (a profiler, a slower machine); 0 turns the rule off.
# The cyclic garbage collector's passes do not count: a full pass walks the whole heap the suite has built
# (over 1 GB late in `make test`'s one process), about 0.8 s of CPU that lands on whichever test happens to
# allocate at that moment. That, not the tests, is what took fast tests of 0.2-0.9 s alone to 2-3 s in
# the whole suite (measured per test with gc.callbacks in a full CI run, 2026-11-27).
FAST_TEST_SECONDS = float(os.environ.get("SPOTGUARD_FAST_TEST_SECONDS", "2"))
_CPU_USED = pytest.StashKey[float]()
_gc_cpu = {"total": 0.0, "began": 0.0}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _gc_timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_cpu["began"] = time.process_time()
    else:
        _gc_cpu["total"] += time.process_time() - _gc_cpu["began"]


gc.callbacks.append(_gc_timed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    before, gc_before = _cpu_seconds(), _gc_cpu["total"]
    yield
    item.stash[_CPU_USED] = _cpu_seconds() - before - (_gc_cpu["total"] - gc_before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or FAST_TEST_SECONDS <= 0:
        return
    cpu = item.stash.get(_CPU_USED, 0.0)
    within = cpu <= FAST_TEST_SECONDS and call.duration <= 3 * FAST_TEST_SECONDS
    if within or item.get_closest_marker("slow"):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"took {cpu:.2f} s of CPU, garbage collection left out ({call.duration:.2f} s of wall time), "
        f"over the {FAST_TEST_SECONDS:g} s a "
        f"test not marked slow may take: {item.nodeid}\nMark it @pytest.mark.slow or make it faster (make "
        "check runs every test not marked slow). SPOTGUARD_FAST_TEST_SECONDS=<seconds> sets the bound "
        "(0: none)."
    )


def load_event(name: str) -> dict[str, Any]:
    return dict(json.loads((EVENTS / name).read_text()))


@pytest.fixture
def event() -> Any:
    return load_event

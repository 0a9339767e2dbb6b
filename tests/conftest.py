"""Shared fixtures. Tests never reach AWS: fake credentials, no endpoint but moto (in-process or on
127.0.0.1), and a guard that fails any test whose code opens a socket to another address."""

from __future__ import annotations

import json
import os
import socket
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
# fixtures) may take at most this long, or it fails and says so. SPOTGUARD_FAST_TEST_SECONDS sets another
# bound (a loaded machine, a profiler); 0 turns the rule off.
FAST_TEST_SECONDS = float(os.environ.get("SPOTGUARD_FAST_TEST_SECONDS", "2"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if (
        call.when != "call"
        or not report.passed
        or FAST_TEST_SECONDS <= 0
        or call.duration <= FAST_TEST_SECONDS
        or item.get_closest_marker("slow") is not None
    ):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"took {call.duration:.2f} s, over the {FAST_TEST_SECONDS:g} s a test not marked slow may take: "
        f"{item.nodeid}\nMark it @pytest.mark.slow or make it faster (make check runs every test not marked "
        "slow). On a loaded machine, SPOTGUARD_FAST_TEST_SECONDS=<seconds> sets the bound (0: none)."
    )


def load_event(name: str) -> dict[str, Any]:
    return dict(json.loads((EVENTS / name).read_text()))


@pytest.fixture
def event() -> Any:
    return load_event

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


def load_event(name: str) -> dict[str, Any]:
    return dict(json.loads((EVENTS / name).read_text()))


@pytest.fixture
def event() -> Any:
    return load_event

"""boto3 clients with botocore's standard retry mode and short timeouts.

Retries live here and only here: `standard` mode retries throttling and transient errors with jittered
backoff, so no adapter loops on its own. The endpoint comes from boto3's own AWS_ENDPOINT_URL setting,
which is how the local stack points everything at moto server on 127.0.0.1.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config

# The interruption path has two minutes: fail fast and let SQS redeliver rather than hang.
URGENT = Config(
    retries={"mode": "standard", "max_attempts": 4},
    connect_timeout=2,
    read_timeout=8,
    max_pool_connections=32,
)

_session: boto3.session.Session | None = None  # one session: service models are loaded once, not per client
_clients: dict[tuple[str, str | None], Any] = {}
_hooks: list[tuple[str, Callable[..., Any]]] = []
_lock = threading.Lock()


def client(service: str, region: str | None = None) -> Any:
    """One client per service per process (clients are thread-safe and costly to create)."""
    global _session
    with _lock:
        key = (service, region)
        if key not in _clients:
            if _session is None:
                _session = boto3.session.Session()
            c = _session.client(service, region_name=region, config=URGENT)
            for event, hook in _hooks:
                c.meta.events.register(event, hook)
            _clients[key] = c
        return _clients[key]


class LazyClient:
    """Stands for `client(service)` and creates it on first use, so that a cold start pays only for
    the services the path needs every time (SSM, Auto Scaling and SQS are needed now and then)."""

    def __init__(self, service: str, region: str | None = None) -> None:
        self._service, self._region = service, region

    def __getattr__(self, name: str) -> Any:
        return getattr(client(self._service, self._region), name)


def on_every_call(hook: Callable[..., None]) -> None:
    """Register a botocore `before-parameter-build` hook (it sees the API parameters) on every client,
    now and later (benchmarks, the demo)."""
    on_event("before-parameter-build", hook)


def on_event(event: str, hook: Callable[..., Any]) -> None:
    """Register a botocore event hook on every client, now and later. The local stack uses
    `before-call.ecs.RunTask` to stand in for ECS placement, which moto does not model."""
    with _lock:
        _hooks.append((event, hook))
        for c in _clients.values():
            c.meta.events.register(event, hook)


def reset() -> None:
    """Forget every client and hook (tests that switch endpoints or mocks)."""
    with _lock:
        _clients.clear()
        _hooks.clear()

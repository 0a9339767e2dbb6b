"""Time as the libraries under SpotGuard read it, patched for the fault tests and the soak: botocore's
backoff between retries taken on the caller's clock, or not at all (`no_backoff`), and Powertools
idempotency's clock, which the caller moves (`powertools_clock`); `patched` sets and puts back what they
change."""

from __future__ import annotations

import contextlib
import datetime as _dt
import time
import types
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def patched(*changes: tuple[Any, str, Any]) -> Iterator[None]:
    """Each (owner, name, value) set for the duration, and put back as it was on the way out."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
    try:
        for owner, name, value in changes:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


class _Sleeps:
    """`time` for botocore's endpoint, whose sleeps (the backoff between retries) go to `sleep`."""

    def __init__(self, sleep: Callable[[float], Any]) -> None:
        self._sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)


@contextlib.contextmanager
def no_backoff(sleep: Callable[[float], Any] = lambda _: None) -> Iterator[None]:
    """botocore's retries without their backoff sleeps on the wall clock (given `sleep`, a virtual clock's
    `advance`, each backoff takes its time there), and its retry quota unlimited (so that one fault's
    exhausted retries cannot change what the next call's retries do)."""
    import botocore.endpoint
    from botocore.retries import quota

    with patched(
        (botocore.endpoint, "time", _Sleeps(sleep)),
        (quota.RetryQuota, "acquire", lambda self, capacity_amount: True),
    ):
        yield


# ------------------------------------------------------------------------------------ time passing
class _Shifted(_dt.datetime):
    offset = _dt.timedelta()

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _Shifted:  # type: ignore[override]
        return super().now(tz) + cls.offset


@contextlib.contextmanager
def powertools_clock() -> Iterator[type[_Shifted]]:
    """Powertools idempotency reads the time as `dt.datetime.now()`: give it a clock the caller moves
    (an in-progress record expires when the visibility timeout has passed, as in AWS)."""
    from aws_lambda_powertools.utilities.idempotency.persistence import base, datarecord, dynamodb

    shim = types.SimpleNamespace(**{k: getattr(_dt, k) for k in dir(_dt) if not k.startswith("_")})
    shim.datetime = _Shifted
    _Shifted.offset = _dt.timedelta()
    try:
        with patched(*((module, "dt", shim) for module in (base, datarecord, dynamodb))):
            yield _Shifted
    finally:
        _Shifted.offset = _dt.timedelta()

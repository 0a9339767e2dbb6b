"""A virtual clock for the whole system in this process (SpotGuard's functions over moto in-process): time
moves only when the caller moves it, and every part that dates something reads it. With the process's
sources of chance seeded, a run repeats exactly.

`installed(clock, seed)` puts it in place, and takes it out on the way out:
- SpotGuard: `spotguard.domain.clock` (every time SpotGuard decides on or writes, the runtimes' `utcnow`);
- moto: `moto.core.utils`'s `datetime`, which every moto service reads its time through (`utcnow`,
  `unix_time`, `unix_time_millis`): SQS's delays, visibility timeouts and timestamps, EventBridge's
  event times, S3's LastModified, EC2's LaunchTime. One name, looked up at each call, so every copy of
  `utcnow` that a moto module imported follows it;
- Powertools idempotency (`dt.datetime.now()`: an in-progress record expires on the virtual clock), and
  what Powertools stamps: its metrics' EMF `Timestamp` (Metrics and single_metric) and every log record's
  time (the logging module's record factory), so that a soak's `functions.log` reads at the virtual time
  and repeats byte for byte;
- chance: moto's own random (its ids: instances, tasks, messages, receipt handles), Python's `random`,
  `uuid.uuid4` and `secrets.token_hex` (SpotGuard's job and event ids), each drawn from the seed.

Not covered, and not read by SpotGuard: S3's bucket CreationDate and Auto Scaling's group CreatedTime
(moto takes them from `datetime` directly), and SQS long polls (the local pollers never wait). moto's
ECS gives tasks no times of their own (the emulator's task events carry them).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import random
import secrets
import types
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar


class VirtualClock:
    """The time of a simulated run: it starts at `start` and moves only by `advance` / `advance_to`."""

    def __init__(self, start: _dt.datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("a virtual clock starts at a time with its zone")
        self._now = start.astimezone(_dt.UTC)

    def now(self) -> _dt.datetime:
        return self._now

    def advance(self, seconds: float) -> _dt.datetime:
        if seconds < 0:
            raise ValueError(f"time does not go back ({seconds} s)")
        self._now += _dt.timedelta(seconds=seconds)
        return self._now

    def advance_to(self, when: _dt.datetime) -> _dt.datetime:
        """Move to `when` (a time already passed changes nothing: time does not go back)."""
        if when > self._now:
            self._now = when.astimezone(_dt.UTC)
        return self._now


class _VirtualDatetime(_dt.datetime):
    """`datetime` whose now() is the installed clock's: naive for moto's utcnow, aware when asked."""

    clock: ClassVar[VirtualClock | None] = None

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _VirtualDatetime:  # type: ignore[override]
        t = cls._clock().now()
        t = t.astimezone(tz) if tz is not None else t.replace(tzinfo=None)
        return cls(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tzinfo=t.tzinfo)

    @classmethod
    def utcnow(cls) -> _VirtualDatetime:  # type: ignore[override]
        return cls.now(None)

    @classmethod
    def _clock(cls) -> VirtualClock:
        if cls.clock is None:
            raise RuntimeError("no virtual clock is installed")
        return cls.clock


def _datetime_module() -> types.SimpleNamespace:
    """The `datetime` module as those who read it see it, but for `datetime.now()`."""
    shim = types.SimpleNamespace(**{k: getattr(_dt, k) for k in dir(_dt) if not k.startswith("_")})
    shim.datetime = _VirtualDatetime
    return shim


class _Chance:
    """Every draw the run makes, from one seed: the same seed, the same ids in the same order."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=self.random.getrandbits(128), version=4)

    def token_hex(self, nbytes: int | None = None) -> str:
        return self.random.getrandbits(8 * (nbytes or 32)).to_bytes(nbytes or 32, "big").hex()


@contextlib.contextmanager
def installed(clock: VirtualClock, seed: int) -> Iterator[VirtualClock]:
    """Put `clock` in place of the wall clock for SpotGuard, moto and Powertools, and draw every id and
    random choice from `seed`; everything as it was on the way out. Install it before the stack is
    deployed (mock_aws started), so that the stack's own names and dates repeat too."""
    import logging

    import moto.core.utils as moto_utils
    from aws_lambda_powertools.metrics import base as metrics_base
    from aws_lambda_powertools.metrics.provider.cloudwatch_emf import cloudwatch
    from aws_lambda_powertools.utilities.idempotency.persistence import base, datarecord, dynamodb
    from moto.moto_api._internal import mock_random

    from spotguard.domain import clock as spotguard_clock

    chance = _Chance(seed)
    shim = _datetime_module()
    saved: list[tuple[Any, str, Any]] = [
        (moto_utils, "datetime", moto_utils.datetime),
        *((m, "dt", m.dt) for m in (base, datarecord, dynamodb, cloudwatch, metrics_base)),
        (uuid, "uuid4", uuid.uuid4),
        (secrets, "token_hex", secrets.token_hex),
    ]
    random_state = random.getstate()
    _VirtualDatetime.clock = clock
    records = logging.getLogRecordFactory()

    def stamped(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = records(*args, **kwargs)
        at = clock.now().timestamp()
        record.created, record.msecs = at, (at - int(at)) * 1000
        return record

    try:
        moto_utils.datetime = shim  # type: ignore[assignment]
        for module in (base, datarecord, dynamodb, cloudwatch, metrics_base):
            module.dt = shim  # type: ignore[attr-defined]
        logging.setLogRecordFactory(stamped)
        uuid.uuid4 = chance.uuid4  # type: ignore[assignment]
        secrets.token_hex = chance.token_hex  # type: ignore[assignment]
        random.seed(seed)
        mock_random.seed(seed)
        spotguard_clock.set_source(clock.now)
        yield clock
    finally:
        logging.setLogRecordFactory(records)
        spotguard_clock.set_source(None)
        for owner, name, value in saved:
            setattr(owner, name, value)
        random.setstate(random_state)
        _VirtualDatetime.clock = None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """SpotGuard's functions without their threads, for as long as a run on the virtual clock lasts. On
    Lambda the interruption function handles a batch's records side by side, and the calls of one record
    side by side too (ListTasks beside the task index); here they go one after the other, in order, each
    with the same result and failure as before (a record's handling is its own either way). With threads,
    which call went first (each moving the clock by its latency, each drawing its ids) would change the
    run: the same seed would not give the same run."""
    from concurrent.futures import Future

    from aws_lambda_powertools.utilities.batch import BatchProcessor

    from spotguard.runtime.interruption import ParallelBatchProcessor
    from spotguard.usecases.interruption import InterruptionService

    def one_after_another(self: Any, *calls: Any) -> list[Future[Any]]:
        futures: list[Future[Any]] = []
        for call in calls:  # every call is made, the first failure raised after all, as side by side
            future: Future[Any] = Future()
            try:
                future.set_result(call())
            except Exception as exc:  # carried to the caller, as the pool would
                future.set_exception(exc)
            futures.append(future)
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]
        return futures

    saved = (ParallelBatchProcessor.process, InterruptionService._side_by_side)
    ParallelBatchProcessor.process = BatchProcessor.process  # type: ignore[method-assign]
    InterruptionService._side_by_side = one_after_another  # type: ignore[method-assign]
    try:
        yield
    finally:
        ParallelBatchProcessor.process, InterruptionService._side_by_side = saved  # type: ignore[method-assign]

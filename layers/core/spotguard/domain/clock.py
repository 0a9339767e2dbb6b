"""The time SpotGuard reads: one source for the whole process. In Lambda it is the wall clock. The local
stack's deterministic simulation (`spotguard_cli.emulator.vclock`) sets a virtual one, so that every time
SpotGuard decides on or writes (a job's, a message's, a pool's) follows it, and a run repeats exactly."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

_source: Callable[[], datetime] | None = None  # None: the wall clock


def now() -> datetime:
    """The time now, with its zone (UTC)."""
    return _source() if _source is not None else datetime.now(UTC)


def monotonic() -> float:
    """Seconds that only move forward, for durations such as a cache's age: the wall's monotonic clock,
    or the virtual clock's seconds."""
    return _source().timestamp() if _source is not None else time.monotonic()


def set_source(source: Callable[[], datetime] | None) -> None:
    """Read the time from `source` from now on (None: the wall clock again)."""
    global _source
    _source = source

"""The time the polling commands (`jobs logs --follow`, `jobs status --watch`) read and wait on: the
system's, or a test's that never sleeps."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FakeClock:
    """Sleeping moves the time on at once; `on_sleep` runs after each sleep (a test changes the world
    there: a new log event, a new attempt, the job's end)."""

    def __init__(self, start: datetime, on_sleep: object = None) -> None:
        self.at = start
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def now(self) -> datetime:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += timedelta(seconds=seconds)
        if callable(self.on_sleep):
            self.on_sleep(len(self.slept))

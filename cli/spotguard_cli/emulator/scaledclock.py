"""`ScaledClock`: the local system's time, faster than the wall clock by a scale and able to jump ahead;
and the reconcile schedule the template gives (`schedule_seconds`)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime

from spotguard_cli.emulator.template import load


class ScaledClock:
    """Time that runs `scale` times faster than the wall clock from the moment it is made: with scale
    300, a second here is five minutes for SpotGuard, so that a job hours long (and its deadline, and
    the capacity policy's ten-minute ticks) plays out in a minute. Scale 1 is the wall clock.

    `jump_to` moves it forward at once (a replay skips the hours when no job runs); it never goes back.
    `start` sets where it starts (a replay starts at its trace's first hour)."""

    def __init__(self, scale: float = 1.0, start: datetime | None = None) -> None:
        if scale <= 0:
            raise ValueError("the time scale must be positive")
        self.scale = scale
        self.origin = datetime.now(UTC)  # the wall clock's reading ...
        self.at = start or self.origin  # ... when this clock read this
        self._lock = threading.Lock()

    def now(self) -> datetime:
        real = datetime.now(UTC)
        if self.scale == 1.0 and self.at == self.origin:
            return real
        with self._lock:
            return self.at + (real - self.origin) * self.scale

    def jump_to(self, when: datetime) -> None:
        """Read `when` from now on (later than now: time moves on by the difference at once)."""
        with self._lock:
            real = datetime.now(UTC)
            now = self.at + (real - self.origin) * self.scale
            if when < now:
                raise ValueError(f"the clock cannot go back from {now.isoformat()} to {when.isoformat()}")
            self.origin, self.at = real, when

    def seconds(self, scaled: float) -> float:
        """Wall-clock seconds for `scaled` seconds of SpotGuard's time."""
        return scaled / self.scale

    def task_environment(self) -> dict[str, str]:
        """What tells the agent in a task to date its manifests on this clock (AgentEnv.clock). Read it
        when the task starts: a jump changes it."""
        if self.scale == 1.0 and self.at == self.origin:
            return {}
        with self._lock:
            return {
                "SPOTGUARD_CLOCK_ORIGIN": f"{self.origin.timestamp():.6f}",
                "SPOTGUARD_CLOCK_AT": f"{self.at.timestamp():.6f}",
                "SPOTGUARD_CLOCK_SCALE": f"{self.scale:g}",
            }


def schedule_seconds() -> float:
    """The reconcile schedule the template gives (rate(N minutes|seconds|hours))."""
    fn = load()["Resources"]["ReconcileFunction"]["Properties"]["Events"]["Schedule"]["Properties"]
    m = re.match(r"rate\((\d+) (minute|minutes|hour|hours|second|seconds)\)", fn["ScheduleExpression"])
    if not m:
        raise ValueError(f"unsupported schedule {fn['ScheduleExpression']!r}")
    unit = {"second": 1, "minute": 60, "hour": 3600}[m.group(2).rstrip("s")]
    return int(m.group(1)) * unit

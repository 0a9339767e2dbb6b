"""`SoakState`: what the soak's loop keeps (set by `Soak.__init__`, loop.py), and its timeline: the lines
whose digest says that a run repeated exactly."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import random

    from spotguard_cli.emulator.faults import Injector
    from spotguard_cli.emulator.gpucluster import Host
    from spotguard_cli.emulator.soak.model import JobBook, Task
    from spotguard_cli.emulator.vclock import VirtualClock
    from spotguard_cli.emulator.world import JobsWorld
    from spotguard_cli.simulator import Trace


class SoakState:
    """What the loop keeps, each set by `Soak.__init__` (where each is explained), and the timeline it
    writes (`_note`), with the faults at SpotGuard's calls heard meanwhile (`_hear`)."""

    world: JobsWorld
    clock: VirtualClock
    traces: list[Trace]
    say: Callable[[str], None]
    faults: float
    chance: random.Random
    later: list[tuple[datetime, int, dict[str, Any]]]
    faults_done: dict[str, int]
    held: Iterator[int]
    total_steps: int
    end: datetime
    hosts_per_pool: int
    pools: list[list[Host]]
    available: list[bool | None]
    reclaims: list[tuple[datetime, Host]]
    boot: timedelta
    booting: list[tuple[datetime, int]]
    tasks: dict[str, Task]
    log: list[str]
    heard: list[str]
    heard_lock: threading.Lock
    interruptions: int
    books: dict[str, JobBook]
    next_reconcile: datetime
    stopped_early: bool
    began: datetime
    days_said: int
    restart: timedelta
    td: str
    injector: Injector | None

    def _note(self, what: str) -> None:
        self._heard()
        self.log.append(f"{self.clock.now().isoformat()} {what}")

    def _hear(self, what: str) -> None:
        """A fault at one of SpotGuard's calls, said by the injector (on the thread that made the call)."""
        with self.heard_lock:
            self.heard.append(f"{self.clock.now().isoformat()} {what}")

    def _heard(self) -> None:
        """The faults said since the soak's last note, onto the timeline in an order of their own (calls
        made side by side on threads say theirs in the order the threads ran)."""
        with self.heard_lock:
            heard, self.heard = sorted(self.heard), []
        self.log += heard

    def _live_on(self, host: Host) -> list[Task]:
        return [
            t for t in self.tasks.values() if t.host == host.container_instance_arn and t.exited_at is None
        ]

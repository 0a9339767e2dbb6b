"""Lambda's concurrency for an SQS event source mapping, as the local stack plays it (`Scaling`): how many
invocations run at once a while into a burst of messages, and where invocations timed one at a time
(`Invocation`) would have begun."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotguard_cli.emulator.stack import FunctionConfig


@dataclass(frozen=True)
class Invocation:
    """One invocation of `QueuePoller.drain_one_by_one`: its records' bodies, and when it began and ended
    (time.monotonic())."""

    bodies: tuple[str, ...]
    started: float
    ended: float


@dataclass(frozen=True)
class Scaling:
    """How many invocations an SQS event source mapping runs at once, t seconds into a burst of messages
    (standard queue, standard mode; AWS Lambda Developer Guide, "Configuring scaling behavior for SQS
    event source mappings"): five batches at first, up to 300 more concurrent invocations per minute
    while messages remain, at most 1,000 batches, and never more than the mapping's MaximumConcurrency or
    the function's reserved concurrency."""

    initial: int = 5
    per_minute: int = 300
    limit: int = 1000

    @property
    def step_seconds(self) -> float:
        """How often the allowance grows by one."""
        return 60.0 / self.per_minute

    def allowed(self, elapsed: float) -> int:
        return min(self.limit, self.initial + self._steps(elapsed))

    def _steps(self, elapsed: float) -> int:
        # the small term keeps a time computed as a whole number of steps from landing just short of it
        return int(max(0.0, elapsed) / self.step_seconds + 1e-9)

    def schedule(
        self, ready: Sequence[float], durations: Sequence[float], cold_seconds: float
    ) -> list[tuple[float, bool]]:
        """When each invocation would begin, and whether in a new execution environment, given when its
        records were ready and how long it runs (seconds, one clock for all), taken in the order given:
        each as soon as its records are ready, the one before it has begun, and fewer are running than
        `allowed` (counted from the first ready time); in an idle environment when an invocation that has
        ended left one, else in a new one, whose start (`cold_seconds`) delays it."""
        if not ready:
            return []
        origin = min(ready)
        ends: list[float] = []  # the running invocations' end times (a heap)
        idle = 0  # environments whose invocation has ended
        placed: list[tuple[float, bool]] = []
        t = origin
        for r, d in zip(ready, durations, strict=True):
            t = max(t, r)  # batches are received in order: none begins before the one received before it
            while True:
                while ends and ends[0] <= t:
                    heapq.heappop(ends)
                    idle += 1
                allowed = self.allowed(t - origin)
                if len(ends) < allowed:
                    break
                if allowed >= self.limit:
                    t = ends[0]
                else:  # the next of: an invocation ends, the allowance grows
                    t = min(ends[0], origin + (self._steps(t - origin) + 1) * self.step_seconds)
            cold = idle == 0
            idle -= 0 if cold else 1
            heapq.heappush(ends, t + (cold_seconds if cold else 0.0) + d)
            placed.append((t, cold))
        return placed

    @classmethod
    def of(cls, fn: FunctionConfig, queue_arn: str) -> Scaling:
        caps = [1000, fn.max_concurrency.get(queue_arn) or 1000, fn.reserved_concurrency or 1000]
        limit = min(caps)
        return cls(initial=min(cls.initial, limit), limit=limit)

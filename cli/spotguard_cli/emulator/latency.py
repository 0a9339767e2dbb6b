"""A latency model for SpotGuard's AWS calls, so that a local run projects to AWS and not to moto on
127.0.0.1: before each call is sent, its thread sleeps for a time drawn from a log-normal distribution
per service (set by its median and 99th percentile). The call then goes to moto as before, and the model
notes how long moto took to answer it (`served`), so that a projection can count each call for its
modelled latency alone and take moto's own time out (bench/local_load.py --latency --isolated).

The figures are assumptions, stated in docs/benchmarks.md next to the figures they produce:
- DynamoDB: AWS states single-digit millisecond latency for its reads and writes; 5 ms median, 25 ms p99
  (a conditional write or a query of a few items, consistent read, in the function's Region).
- ECS control plane (ListTasks, StopTask, UpdateContainerInstancesState, DescribeTasks): no published
  figure; 60 ms median, 250 ms p99, an estimate on the slow side.
- SQS, SSM, Auto Scaling, others: 15 ms / 60 ms (SQS), 100 ms / 400 ms (SSM SendCommand), 50 ms / 200 ms.
- The event's way to the function (`delivery`, drawn by bench/local_load.py --isolated, not by a call):
  EventBridge to the SQS target, 40 ms median, 150 ms p99 (the Amazon Key team reported 80 ms p90 end to
  end on EventBridge, AWS Architecture Blog, February 2026), then the poller's receive, as SQS above.
Throttling is not modelled.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spotguard.adapters import clients

Z99 = 2.3263  # the 99th percentile of the standard normal distribution


@dataclass(frozen=True)
class Latency:
    median_ms: float
    p99_ms: float

    def draw(self, rng: random.Random) -> float:
        """Seconds."""
        sigma = math.log(self.p99_ms / self.median_ms) / Z99
        return rng.lognormvariate(math.log(self.median_ms), sigma) / 1000.0


DEFAULTS: dict[str, Latency] = {
    "dynamodb": Latency(5, 25),
    "ecs": Latency(60, 250),
    "sqs": Latency(15, 60),
    "ssm": Latency(100, 400),
}
OTHER = Latency(50, 200)
EVENTBRIDGE = Latency(40, 150)


@dataclass(frozen=True)
class Served:
    """One call's round trip to moto: when the answer came (time.monotonic()), how long it took after the
    modelled wait, the modelled wait before it, and the call's botocore request context (the same dict
    its other hooks see)."""

    ended: float
    seconds: float
    waited: float
    context: dict[str, Any]

    @property
    def sent(self) -> float:
        """When the call went to moto, its modelled wait over."""
        return self.ended - self.seconds

    @property
    def began(self) -> float:
        """When its modelled wait began."""
        return self.ended - self.seconds - self.waited


@dataclass
class LatencyModel:
    by_service: dict[str, Latency] = field(default_factory=lambda: dict(DEFAULTS))
    other: Latency = OTHER
    seed: int = 21
    enabled: bool = True
    slept_seconds: float = 0.0
    served: list[Served] = field(default_factory=list, init=False, repr=False)
    _sent: threading.local = field(default_factory=threading.local, init=False, repr=False)
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def delivery(self) -> float:
        """Seconds from an event put on the bus to its record in the hands of the SQS poller."""
        with self._lock:
            return EVENTBRIDGE.draw(self._rng) + self.by_service.get("sqs", self.other).draw(self._rng)

    def install(self) -> LatencyModel:
        """On every SpotGuard client, now and later (`clients.on_event`)."""
        clients.on_event("before-send", self._before_send)
        clients.on_event("response-received", self._response_received)
        return self

    def _before_send(self, request: Any, **kwargs: Any) -> None:
        if not self.enabled:
            return None
        service = str(kwargs.get("event_name", "")).split(".")[1:2]
        latency = self.by_service.get(service[0] if service else "", self.other)
        with self._lock:
            seconds = latency.draw(self._rng)
            self.slept_seconds += seconds
        time.sleep(seconds)
        self._sent.at = (time.monotonic(), seconds)  # the call goes to moto now, in this thread
        return None

    def _response_received(self, context: dict[str, Any], **kwargs: Any) -> None:
        at: tuple[float, float] | None = getattr(self._sent, "at", None)
        if at is None:  # sent while the model was off
            return
        self._sent.at = None
        sent, waited = at
        now = time.monotonic()
        with self._lock:
            self.served.append(Served(now, now - sent, waited, context))

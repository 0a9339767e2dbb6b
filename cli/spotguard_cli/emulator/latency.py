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

On a virtual clock (emulator/vclock.py: the soak, the replay) the same model gives each invocation its
duration: `LatencyModel(sleep=clock.advance)` moves the clock by each call's latency instead of sleeping,
and `ColdStarts` adds a function's init duration when its execution environment starts: at its first
invocation, and again after it was left idle longer than `idle_seconds`. Assumptions, stated beside the
replay's figures (docs/replay.md): init 800 ms median, 2 s p99 (Python with boto3 and Powertools in
512 MB; AWS publishes no figure), environments recycled after 10 idle minutes (AWS states no figure).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spotguard.adapters import clients

if TYPE_CHECKING:
    from spotguard_cli.emulator.lambdas import FunctionHost
    from spotguard_cli.emulator.vclock import VirtualClock

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
INIT = Latency(800, 2000)  # a cold start's init duration (see above)
IDLE_RECYCLE_SECONDS = 600.0


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
    sleep: Callable[[float], Any] = time.sleep  # a virtual clock's `advance`: calls take virtual time
    applies: Callable[[], bool] = lambda: True  # whether the call now being sent takes its latency
    keep_served: bool = True  # note each call's round trip to moto (`served`: for projections)
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
        if not self.enabled or not self.applies():
            return None
        service = str(kwargs.get("event_name", "")).split(".")[1:2]
        latency = self.by_service.get(service[0] if service else "", self.other)
        with self._lock:
            seconds = latency.draw(self._rng)
            self.slept_seconds += seconds
        self.sleep(seconds)
        self._sent.at = (time.monotonic(), seconds)  # the call goes to moto now, in this thread
        return None

    def _response_received(self, context: dict[str, Any], **kwargs: Any) -> None:
        at: tuple[float, float] | None = getattr(self._sent, "at", None)
        if at is None or not self.keep_served:  # sent while the model was off, or not noted
            return
        self._sent.at = None
        sent, waited = at
        now = time.monotonic()
        with self._lock:
            self.served.append(Served(now, now - sent, waited, context))


@dataclass
class ColdStarts:
    """Lambda's cold starts on a virtual clock: a function's init duration passes (`advance`) before an
    invocation when its execution environment starts, at its first invocation and after it was idle
    longer than `idle_seconds`. `wrap` each FunctionHost whose invocations should pay them."""

    now: Callable[[], datetime]
    advance: Callable[[float], Any]
    init: Latency = INIT
    idle_seconds: float = IDLE_RECYCLE_SECONDS
    seed: int = 22
    starts: int = 0  # cold starts so far
    init_seconds: float = 0.0  # their init durations, in all
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def wrap(self, host: FunctionHost) -> None:
        handler = host.handler
        last: list[datetime] = []  # when the environment last finished an invocation

        def invoke(event: Any, context: Any) -> Any:
            if not last or (self.now() - last[-1]).total_seconds() > self.idle_seconds:
                seconds = self.init.draw(self._rng)
                self.starts, self.init_seconds = self.starts + 1, self.init_seconds + seconds
                self.advance(seconds)
            try:
                return handler(event, context)
            finally:
                last[:] = [self.now()]

        host.handler = invoke


def timed_invocations(
    functions: dict[str, FunctionHost],
    clock: VirtualClock,
    seed: int,
    leave_out: tuple[str, ...] = ("JobsFunction",),
) -> ColdStarts:
    """On a virtual clock, every invocation of the functions (logical id -> host) takes time, as on Lambda:
    each AWS call its modelled latency, and a cold start its init duration. The jobs function is left out
    by default: a soak's or a replay's own questions (a job's status) go through it, and what a user's
    submit takes does not matter there. The cold starts, counted."""
    from spotguard_cli.emulator.iam import RUNNING

    timed = {name for name in functions if name not in leave_out}
    LatencyModel(
        seed=seed, sleep=clock.advance, applies=lambda: RUNNING.get() in timed, keep_served=False
    ).install()
    cold = ColdStarts(clock.now, clock.advance, seed=seed + 1)
    for name in sorted(timed):
        cold.wrap(functions[name])
    return cold

"""`Soak`: a soak's loop on the virtual clock: at each step the pools, the held events, the submits and
cancels, the tasks, every queue drained and the reconcile schedule, then the clock on to the next thing
due; a long run says how far it got once a virtual day, and Ctrl-C ends it at its next step."""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from spotguard_cli.emulator.soak.counts import SoakCounts
from spotguard_cli.emulator.soak.faults import WORLD_FAULTS
from spotguard_cli.emulator.soak.model import (
    COMMIT_MINUTES,
    RECONCILE_SECONDS,
    RESTART_MINUTES,
    START,
    STEP_MINUTES,
    SUBMIT_HOURS,
    JobBook,
    SoakPlan,
)
from spotguard_cli.emulator.soak.world import SoakWorld

if TYPE_CHECKING:
    from spotguard_cli.emulator.gpucluster import Host
    from spotguard_cli.emulator.soak.model import Task
    from spotguard_cli.emulator.vclock import VirtualClock
    from spotguard_cli.emulator.world import JobsWorld


class Soak(SoakWorld, SoakCounts):
    """A soak: its world (world.py) and faults (faults.py) played step by step on the virtual clock, and
    what it counted at the end (counts.py)."""

    def __init__(
        self, world: JobsWorld, clock: VirtualClock, plan: SoakPlan, say: Callable[[str], None]
    ) -> None:
        import random

        traces, jobs, job_hours, hours = plan.traces, plan.jobs, plan.job_hours, plan.hours
        hosts_per_pool, seed = plan.hosts_per_pool, plan.seed
        self.faults, self.chance = plan.faults, random.Random(seed * 7919 + 1)  # faults: their own draws
        self.later: list[tuple[datetime, int, dict[str, Any]]] = []  # task events held back (heap)
        self.faults_done: dict[str, int] = dict.fromkeys(WORLD_FAULTS, 0)
        self.held = itertools.count()  # the order of events held back at one time
        self.world, self.clock, self.traces, self.say = world, clock, traces, say
        self.total_steps = max(1, round(job_hours * 60 / STEP_MINUTES))
        self.end = START + timedelta(hours=hours)
        self.hosts_per_pool = hosts_per_pool
        self.pools: list[list[Host]] = [[] for _ in traces]
        self.available: list[bool | None] = [None for _ in traces]
        self.reclaims: list[tuple[datetime, Host]] = []
        self.boot = timedelta(seconds=plan.boot_seconds)
        self.booting: list[tuple[datetime, int]] = []  # (joins at, pool): instances launched, not yet joined
        self.tasks: dict[str, Task] = {}
        self.log: list[str] = []
        self.heard: list[str] = []  # the faults at SpotGuard's calls, said since the soak's last note
        self.heard_lock = threading.Lock()
        self.interruptions = 0
        draw = random.Random(seed)
        window = min(SUBMIT_HOURS, hours / 2) * 3600  # every job is submitted, however short the run
        self.books = {
            f"soak-{i:03d}": JobBook(f"soak-{i:03d}", "", START + timedelta(seconds=draw.uniform(0, window)))
            for i in range(jobs)
        }
        self.next_reconcile = START + timedelta(seconds=RECONCILE_SECONDS)
        self.stopped_early = False  # Ctrl-C ended the run before its hours
        self.began, self.days_said = clock.now(), 0  # `_progress`: a line a virtual day
        self.restart = timedelta(minutes=RESTART_MINUTES)  # RunTask to the first step (a replay's D)
        self.td = world.cluster.gpu_task_definition(gpus=1)
        from spotguard.adapters import clients

        clients.on_event("after-call.ecs.StopTask", self._stop_asked)
        self.injector = self._injector(plan, seed)

    # ------------------------------------------------------------------------------------ the loop
    def run(self) -> None:
        with self._faults_in_place(), _stop_on_interrupt() as stop:
            while self.clock.now() < self.end:
                if stop.is_set():  # Ctrl-C: the run ends here, between two steps, as if its hours ran out
                    self.stopped_early = True
                    self._note("stopped by the user (Ctrl-C)")
                    break
                now = self.clock.now()
                self._traces(now)
                self._deliver_held(now)
                self._submit(now)
                self._cancel(now)
                self._discover(now)
                self._tasks(now)
                self._drain()
                if now >= self.next_reconcile:
                    self._reconcile()
                    self.next_reconcile = now + timedelta(seconds=RECONCILE_SECONDS)
                    self._drain()
                if self._all_ended():
                    break
                self._progress(now)
                self.clock.advance_to(min(self._next_due(now), self.end))

    def _progress(self, now: datetime) -> None:
        """A line for whoever watches a long run, once a virtual day: how far it got (from the model)."""
        day = int((now - self.began).total_seconds() // 86400)
        if day <= self.days_said:
            return
        self.days_said = day
        done = len({t.job_id for t in self.tasks.values() if t.exit_code == 0})
        live = sum(1 for t in self.tasks.values() if t.exited_at is None)
        self.say(
            f"day {day}: {done} of {len(self.books)} jobs' work done, {live} task(s) alive, "
            f"{len(self.tasks)} placed so far, {self.interruptions} spot warnings"
        )

    def _reconcile(self) -> None:
        """The schedule's run. Failed under faults at SpotGuard's calls (an error it let out, or cut), it
        simply runs again at the next schedule, as Lambda's scheduled invocations do; without them, a
        failure is SpotGuard's own and ends the soak."""
        try:
            self.world.reconcile()
        except Exception as exc:
            if self.injector is None:
                raise
            self._note(f"reconcile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")

    # -------------------------------------------------------------------------------- the queues
    def _drain(self) -> None:
        for _ in range(20):  # until nothing more comes (each handler may put more on another queue)
            moved = sum(p.drain()[0] for p in self.world.pollers if self._receivable(p.queue_url))
            self._discover(self.clock.now())  # a RunTask just now: its task is placed now
            if not moved:
                return

    def _receivable(self, queue_url: str) -> bool:
        """The queue has a message to receive now (asked of moto's backend: an empty receive is the
        soak's most frequent call otherwise)."""
        from moto.sqs.models import sqs_backends

        stack = self.world.stack
        queue = sqs_backends[stack.account][stack.region].queues.get(queue_url.rsplit("/", 1)[-1])
        return queue is None or bool(queue.messages)

    def _next_due(self, now: datetime) -> datetime:
        """The next time something is due: a task's start, commit, exit; a pool's change; a reclaim; a
        queued message; reconcile; a submit."""
        due = [self.next_reconcile]
        gap = timedelta(hours=self.traces[0].gap_hours)
        due.append(START + gap * (self._tick(now) + 1))
        due += [when for when, _ in self.reclaims]
        due += [when for when, _ in self.booting]
        due += [when for when, _, _ in self.later]
        due += [b.submit_at for b in self.books.values() if not b.submitted]
        for t in self.tasks.values():
            if t.exited_at is not None:
                continue
            if t.running_at is None:
                due.append(t.placed_at + self.restart)
            elif t.stop_asked_at is not None:
                due.append(t.stop_asked_at + timedelta(seconds=t.stop_seconds))
            else:
                due.append((t.last_commit_at or t.running_at) + timedelta(minutes=COMMIT_MINUTES))
                left = self.total_steps - t.resumed_step
                due.append(t.running_at + t.overhead + timedelta(minutes=STEP_MINUTES * left))
        queued = self._queue_due()
        if queued is not None:
            due.append(queued)
        later = [d for d in due if d > now]
        return min(later) if later else now + timedelta(seconds=RECONCILE_SECONDS)

    def _queue_due(self) -> datetime | None:
        """When the next message on a queue becomes receivable (delayed, or invisible after a receive)."""
        from moto.sqs.models import sqs_backends

        stack = self.world.stack
        soonest: float | None = None
        for queue in sqs_backends[stack.account][stack.region].queues.values():
            for m in queue._messages:
                at = max(m.delayed_until, m.visible_at)
                soonest = at if soonest is None else min(soonest, at)
        if soonest is None:
            return None
        return datetime.fromtimestamp(soonest / 1000 + 0.001, UTC)

    def _all_ended(self) -> bool:
        """Every job's work is done (a task of each exited 0) and SpotGuard says each job finished: the
        soak ends early. A job that fails or gives up never gets there: the run goes on to the end."""
        if not all(b.submitted for b in self.books.values()):
            return False
        done = {t.job_id for t in self.tasks.values() if t.exit_code == 0}
        done |= {b.job_id for b in self.books.values() if b.cancelled_at is not None}
        if len(done) < len(self.books):
            return False
        with self._own():
            return all(
                self.world.invoke({"action": "status", "job_id": j})["job"]["finished"] for j in self.books
            )


@contextlib.contextmanager
def _stop_on_interrupt() -> Iterator[threading.Event]:
    """A first Ctrl-C asks a long run to end at its next step and say what it found so far (nothing is
    cut half-way, so nothing is counted stuck that was not); a second one stops it at once. Only on the
    main thread (where Python takes signals); elsewhere, nothing changes."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def asked(signum: int, frame: Any) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one: KeyboardInterrupt

    before = signal.signal(signal.SIGINT, asked)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, before)

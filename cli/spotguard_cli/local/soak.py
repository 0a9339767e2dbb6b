"""`spotguard local soak`: many jobs through spot availability traces, the whole system in this process on
a virtual clock (emulator/vclock.py), and what must never happen counted.

The stack's functions run over moto in this process (`make_jobs_world`, no hosts of its own). Each trace is a
spot pool (g5.xlarge in a zone of its own) of `--hosts-per-pool` instances: when the trace says spot is gone,
every instance of the pool gets its spot warning through the interruption function and is taken back two
minutes later; when it is back, as many new instances are launched, and each joins the cluster
`--boot-seconds` later (the local stack's boot model, emulator/boot.py), or never if spot goes first. `--jobs`
one-GPU jobs are submitted over the first hours, each `--job-hours` of work. Their tasks are modelled, not
run: a task placed by RunTask runs `RESTART_MINUTES` later from the checkpoint SpotGuard gave it, makes a step
every `STEP_MINUTES`, commits every `COMMIT_MINUTES` (a manifest in the checkpoint bucket and its event, as
the agent writes it), exits 0 when its work is done, and when SpotGuard stops it (StopTask: a warning, a
cancel, a stray) commits and exits 75 `STOP_SECONDS` later, unless its instance is taken back first (then it
is gone without a word). Every SQS delay, visibility timeout, retry and reconcile sweep (every 5 minutes) runs
on the virtual clock, which jumps from one thing due to the next. Each invocation of SpotGuard's functions
takes virtual time, as on Lambda: every AWS call its modelled latency, and an execution environment's start
its init duration (emulator/latency.py).

`--faults RATE` plays, each with chance RATE where it can happen, drawn from the seed:
- task events delivered twice, or held back so that a later one overtakes them, or a RUNNING event lost
  for good (reconcile must take the start from ECS); instances taken back without a warning; a stopped
  task's last commit that takes longer than the warning, so that the instance goes mid-commit (its data
  files in S3, no manifest: SpotGuard must resume from the one before); a job cancelled by its user
  (`jobs cancel`) an hour or three after its submit, whose StopTask may then meet the call faults below (the
  cancel must still end: the job cancelled, or succeeded if it finished first);
- at every AWS call SpotGuard's functions make (`--call-faults RATE`, default the same; the soak's own
  calls are never faulted): throttled or failed with a 5xx (once: botocore's retry absorbs it; every
  attempt: SpotGuard sees the error), its answer lost after it took effect (SpotGuard sees a timeout, or
  botocore sends the call again), a DynamoDB conditional write raced by a twin, or the invocation cut
  there (timed out or crashed: what it did so far stands; an SQS batch comes back after the visibility
  timeout, the reconcile runs again at its next schedule, and the soak, as a user's CLI, submits again
  the same job after a failed submit).

It prints what must be zero: jobs lost (not succeeded by the end), attempts of one job running at once,
committed steps lost (a task started from an older checkpoint than the newest committed before it was
placed), messages in dead-letter queues, jobs stuck (neither running, nor waiting with a retry due, nor
ended) at the end, and cancels not done (a job its user cancelled that still runs long after); and a
digest of the run. The same seed gives the same run, byte for byte. A long
run prints a line a virtual day; Ctrl-C ends it at its next step and prints what it found so far (a
second Ctrl-C stops it at once).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import heapq
import itertools
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from unittest import mock

from spotguard_cli import arguments

if TYPE_CHECKING:
    from spotguard_cli.emulator.faults import Injector
    from spotguard_cli.emulator.gpucluster import Host
    from spotguard_cli.emulator.latency import ColdStarts
    from spotguard_cli.emulator.vclock import VirtualClock
    from spotguard_cli.emulator.world import JobsWorld
    from spotguard_cli.simulator import Trace

START = datetime(2030, 1, 7, tzinfo=UTC)  # the virtual clock's start: a Monday
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")
INSTANCE_TYPE = "g5.xlarge"
RESTART_MINUTES = 6.0  # RunTask to the first step after a restore
STEP_MINUTES = 5.0  # a step of work
COMMIT_MINUTES = 30.0  # the agent's interval between checkpoints
STOP_SECONDS = 20  # a stopped task's last commit, then exit 75
WARNING_SECONDS = 120  # spot's warning before the instance is taken back
RECONCILE_SECONDS = 300  # the reconcile schedule
RETRY_BASE_SECONDS = 30  # the stack's first wait for capacity
SUBMIT_RETRY_SECONDS = 60  # a user's CLI submits again after a failed invocation
CANCEL_AFTER_HOURS = (1.0, 3.0)  # a job drawn to be cancelled: that long after its submit
CANCEL_REASON = "soak: cancelled by the user"
CANCEL_BOUND_SECONDS = 1800  # a cancel asked this long before the end must have ended its job
# The faults `--faults RATE` draws, each at every place it can happen: a task event delivered twice, or
# held back (a later one overtakes it), a spot instance taken back with no warning, a stopped task's last
# commit cut by the reclaim; and at SpotGuard's AWS calls (emulator/faults.py), throttling and 5xx (once,
# or every attempt), a lost answer (seen, or retried by botocore), a conditional write raced, and the
# invocation cut.
WORLD_FAULTS = ("duplicated", "reordered", "no-warning", "commit-cut", "lost-running", "cancelled")
CALL_FAULTS = (
    "throttle-once",
    "throttle-exhaust",
    "5xx-once",
    "5xx-exhaust",
    "lost",
    "lost-retried",
    "race",
    "cut",
)
FAULTS = WORLD_FAULTS + CALL_FAULTS
SUBMIT_HOURS = 6.0  # the jobs are submitted over the first hours (the first half of a shorter run)
STATE_DIR = Path(".local-stack") / "soak"  # the functions' logs and the run's timeline


def add_parser(actions: Any) -> None:
    s = actions.add_parser(
        "soak",
        help="many jobs through spot traces on a virtual clock: what must never happen, counted",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--trace", action="append", required=True, metavar="FILE", help="a spot pool; repeat (1-6)"
    )
    s.add_argument("--jobs", type=arguments.count, default=50, metavar="N", help="jobs (default 50)")
    s.add_argument(
        "--job-hours", type=arguments.positive("--job-hours"), default=24.0, metavar="C", help="work per job"
    )
    s.add_argument(
        "--hours",
        type=arguments.positive("--hours"),
        default=None,
        metavar="H",
        help="the traces' hours to play (default: all of the shortest)",
    )
    s.add_argument(
        "--hosts-per-pool", type=arguments.count, default=None, metavar="K", help="instances a pool has"
    )
    s.add_argument(
        "--boot-seconds",
        type=arguments.number(0, 3600),
        default=None,
        metavar="S",
        help="from spot coming back to the pool's new instances joining the cluster (default: the local "
        "stack's boot model's, emulator/boot.py; 0: at once)",
    )
    s.add_argument(
        "--faults",
        type=arguments.number(0, 1),
        default=0.0,
        metavar="RATE",
        help="the chance of each fault where it can happen (0-1): events duplicated or reordered, "
        "instances gone without a warning, a last commit cut by the reclaim, and at each of SpotGuard's "
        "AWS calls: throttled, a 5xx, its answer lost, a conditional write raced, the invocation cut",
    )
    s.add_argument(
        "--call-faults",
        type=arguments.number(0, 1),
        default=None,
        metavar="RATE",
        help="the chance of a fault at each of SpotGuard's AWS calls (default: --faults)",
    )
    s.add_argument("--seed", type=arguments.seed, default=1, metavar="S")
    s.add_argument("--json", action="store_true", help="the result as JSON")
    s.set_defaults(run=run)
    arguments.one_line_errors(s, "spotguard local soak")


@dataclass
class Task:
    """A modelled task of a job: where and when it runs, how far it got, what it committed."""

    arn: str
    job_id: str
    attempt: int
    host: str  # container instance ARN
    placed_at: datetime
    resumed_step: int
    running_at: datetime | None = None
    last_commit_at: datetime | None = None  # the agent's last commit (its interval counts from it)
    stop_asked_at: datetime | None = None
    exited_at: datetime | None = None
    exit_code: int | None = None
    stop_seconds: float = STOP_SECONDS  # its last commit after a stop (a fault: longer than the warning)

    overhead: timedelta = timedelta(0)  # from RUNNING to the first step's start (a replay's restart, D)

    @property
    def works_from(self) -> datetime | None:
        return None if self.running_at is None else self.running_at + self.overhead

    def step_at(self, now: datetime, total: int) -> int:
        start = self.works_from
        if start is None or now < start:
            return self.resumed_step
        done = int((now - start).total_seconds() // (STEP_MINUTES * 60))
        return min(total, self.resumed_step + done)


@dataclass
class JobBook:
    """What the soak knows of a job: its checkpoints (step of each manifest, the newest committed) and
    what was lost."""

    job_id: str
    checkpoint_uri: str
    submit_at: datetime
    submitted: bool = False
    sequence: int = 0
    steps: dict[str, int] = field(default_factory=dict)  # manifest URI -> its step
    newest_step: int = 0
    steps_lost: int = 0
    cancel_at: datetime | None = None  # the user cancels the job then (a fault)
    cancelled_at: datetime | None = None  # when SpotGuard took the cancel (its answer, or the job says so)


@dataclass
class Result:
    jobs: int
    succeeded: int
    unfinished: int  # still running, or waiting with a retry due, when the traces' hours ran out
    lost: list[str]
    twice_at_once: list[str]
    steps_lost: int
    dead_letters: int
    stuck: list[str]
    interruptions: int
    tasks: int
    virtual_hours: float
    digest: str
    denied: list[str] = field(default_factory=list)  # calls a function's role does not allow
    cancelled: int = 0  # jobs their user cancelled that ended cancelled
    cancels_undone: list[str] = field(default_factory=list)  # cancelled long before the end, still not ended
    faults: dict[str, int] = field(default_factory=dict)  # the faults played, by kind
    cold_starts: int = 0  # the functions' execution environments started (each an init duration)
    stopped_early: bool = False  # Ctrl-C ended the run before its hours (what it found so far)
    dead_letter_lines: list[str] = field(default_factory=list)  # queue: why (rejected) or the body
    timeline: list[str] = field(default_factory=list, repr=False)  # what happened, when (virtual time)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.twice_at_once
            or self.steps_lost
            or self.dead_letters
            or self.stuck
            or self.denied
            or self.cancels_undone
        )


@dataclass(frozen=True)
class Plan:
    """What a soak runs: the pools' traces, the jobs and their work, how long, how big a pool, the seed."""

    traces: list[Trace]
    jobs: int
    job_hours: float
    hours: float
    hosts_per_pool: int
    seed: int
    faults: float = 0.0  # the chance of each fault (FAULTS) at each place it can happen
    call_faults: float | None = None  # the chance at each of SpotGuard's AWS calls (None: `faults`)
    boot_seconds: float = 0.0  # spot back -> the pool's new instances join the cluster (the boot model's)


class Soak:
    def __init__(self, world: JobsWorld, clock: VirtualClock, plan: Plan, say: Callable[[str], None]) -> None:
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

    def _injector(self, plan: Plan, seed: int) -> Injector | None:
        """Faults at SpotGuard's own AWS calls, only while one of its functions runs (emulator/faults.py):
        installed after the soak's own hooks, so that a lost answer to StopTask is still seen by the
        model (ECS did stop the task)."""
        import random

        from spotguard_cli.emulator.faults import Injector
        from spotguard_cli.emulator.iam import RUNNING

        rate = plan.faults if plan.call_faults is None else plan.call_faults
        if rate <= 0:
            return None
        stack = self.world.stack
        env = stack.functions["JobsFunction"].environment
        tables = {env["SPOTGUARD_LEDGER_TABLE"]: "ledger", env["SPOTGUARD_IDEMPOTENCY_TABLE"]: "idempotency"}
        injector = Injector(stack.client, tables, record=False)
        injector.install()
        injector.seeded(
            rate, random.Random(seed * 7919 + 2), say=self._hear, in_scope=lambda: RUNNING.get() is not None
        )
        return injector

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

    def _faults_in_place(self) -> contextlib.AbstractContextManager[None]:
        """With faults at SpotGuard's calls: moto skips a request the injector answered with an error, and
        botocore's backoff between retries takes its time on the virtual clock, not the wall clock. The
        functions run without their threads in every soak (`virtual_system`), so a cut ends the invocation
        where it happens, the records after it never handled, as in Lambda."""
        if self.injector is None:
            return contextlib.nullcontext()
        from spotguard_cli.emulator.faults import moto_skips_answered_requests, no_backoff

        stack = contextlib.ExitStack()
        stack.enter_context(moto_skips_answered_requests())
        stack.enter_context(no_backoff(sleep=self.clock.advance))
        return stack

    def _own(self) -> contextlib.AbstractContextManager[None]:
        """The soak's own look at the system through SpotGuard's code (a job's status): never faulted."""
        return contextlib.nullcontext() if self.injector is None else self.injector.paused()

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

    # ----------------------------------------------------------------------------------- the pools
    def _tick(self, now: datetime) -> int:
        gap = self.traces[0].gap_hours * 3600
        return int((now - START).total_seconds() // gap)

    def _traces(self, now: datetime) -> None:
        tick = self._tick(now)
        for i, trace in enumerate(self.traces):
            up = trace.available[min(tick, len(trace.available) - 1)]
            if up == self.available[i]:
                continue
            self.available[i] = up
            if up:  # the group launches what the pool lacks; each instance joins once booted
                launched = self.hosts_per_pool - len(self.pools[i])
                self.booting += [(now + self.boot, i)] * launched
                self._note(f"pool {i}: spot back, {launched} instance(s) launched")
            else:
                gone = [b for b in self.booting if b[1] == i]
                if gone:  # still booting: taken back before they join
                    self._note(f"pool {i}: {len(gone)} booting instance(s) gone")
                    self.booting = [b for b in self.booting if b[1] != i]
                for host in self.pools[i]:
                    if self._fault("no-warning"):  # spot takes the instance back without a word
                        self.reclaims.append((now, host))
                        self._note(f"pool {i}: {host.instance_id} goes without a warning")
                        continue
                    self.world.interrupt(host)  # the warning, through the interruption function
                    self.interruptions += 1
                    self.reclaims.append((now + timedelta(seconds=WARNING_SECONDS), host))
                    self._note(f"pool {i}: spot warning for {host.instance_id}")
                    self._slow_last_commits(host)
                self.pools[i] = []
        for when, i in [b for b in self.booting if b[0] <= now]:
            self.booting.remove((when, i))
            host = self.world.cluster.add_host(INSTANCE_TYPE, ZONES[i])
            self.pools[i].append(host)
            self._note(f"pool {i}: {host.instance_id} joins")
        for when, host in [r for r in self.reclaims if r[0] <= now]:
            self.reclaims.remove((when, host))
            for task in self._live_on(host):
                if task.stop_asked_at is not None and task.running_at is not None:
                    self._commit_cut(task)  # stopped, still writing its last checkpoint
                reason = f"Host EC2 (instance {host.instance_id}) terminated."
                self._exit(task, None, reason)
            self.world.cluster.remove_host(host)
            self._note(f"{host.instance_id} taken back")

    def _slow_last_commits(self, host: Host) -> None:
        """A fault: a task the warning stopped takes longer than the warning to write its last checkpoint
        (a big one, a slow store), so the reclaim cuts it."""
        for task in self._live_on(host):
            if task.stop_asked_at is not None and task.running_at is not None and self._fault("commit-cut"):
                task.stop_seconds = WARNING_SECONDS + self.chance.uniform(10, 300)
                self._note(
                    f"fault: {task.arn[-8:]} ({task.job_id}/{task.attempt})'s last commit takes "
                    f"{task.stop_seconds:.0f} s, longer than the warning"
                )

    def _live_on(self, host: Host) -> list[Task]:
        return [
            t for t in self.tasks.values() if t.host == host.container_instance_arn and t.exited_at is None
        ]

    # ------------------------------------------------------------------------------------ the jobs
    def _submit(self, now: datetime) -> None:
        from spotguard_cli.emulator.lambdas import InvocationFailed

        for book in self.books.values():
            if book.submitted or book.submit_at > now:
                continue
            try:
                answer = self.world.invoke(
                    {
                        "action": "submit",
                        "job_id": book.job_id,
                        "request": {"cluster": "gpu-spot", "taskDefinition": self.td, "launchType": "EC2"},
                        "options": {"max_attempts": 100},
                    }
                )
            except InvocationFailed as exc:  # Lambda's error: the user's CLI submits the same job again
                answer = {"ok": False, "error": {"type": "InvocationFailed", "message": str(exc)}}
            failed = answer.get("error", {}).get("type") in ("InternalError", "InvocationFailed")
            if not answer.get("ok") and failed and self.injector is not None:  # a fault (else: SpotGuard)
                book.submit_at = now + timedelta(seconds=SUBMIT_RETRY_SECONDS)
                why = answer["error"]["message"]
                self._note(f"{book.job_id} submit failed ({why}): again at {book.submit_at.isoformat()}")
                continue
            if not answer.get("ok"):
                raise RuntimeError(f"submit {book.job_id}: {answer}")
            book.submitted, book.checkpoint_uri = True, answer["job"]["checkpoint_uri"]
            self._note(f"{book.job_id} submitted")
            if self._fault("cancelled"):
                book.cancel_at = now + timedelta(hours=self.chance.uniform(*CANCEL_AFTER_HOURS))
                self._note(
                    f"fault: {book.job_id} to be cancelled by its user at {book.cancel_at.isoformat()}"
                )

    def _cancel(self, now: datetime) -> None:
        """The user's `jobs cancel`, once; again later only when SpotGuard did not take it (the job neither
        says it was cancelled nor has ended): an error answer after the cancel was written (a StopTask
        that failed) is left to SpotGuard, as a user who reads the job's status would leave it."""
        from spotguard_cli.emulator.lambdas import InvocationFailed

        for book in self.books.values():
            if book.cancel_at is None or book.cancelled_at is not None or book.cancel_at > now:
                continue
            try:
                answer = self.world.invoke(
                    {"action": "cancel", "job_id": book.job_id, "reason": CANCEL_REASON}
                )
            except InvocationFailed as exc:
                answer = {"ok": False, "error": {"type": "InvocationFailed", "message": str(exc)}}
            with self._own():
                job = self.world.invoke({"action": "status", "job_id": book.job_id})["job"]
            if answer.get("ok") or job["finished"] or job["last_reason"] == CANCEL_REASON:
                book.cancelled_at = now
                said = "ok" if answer.get("ok") else answer["error"]["message"].splitlines()[0][:120]
                self._note(f"{book.job_id} cancelled by its user ({said}); the job is {job['state']}")
            else:
                book.cancel_at = now + timedelta(seconds=SUBMIT_RETRY_SECONDS)
                self._note(f"{book.job_id} cancel failed ({answer['error']['message'][:120]}): again later")

    # ----------------------------------------------------------------------------------- the tasks
    def _discover(self, now: datetime) -> None:
        """The tasks RunTask placed since the last look: each starts its run now."""
        for arn, host in list(self.world.scheduler.placed.items()):
            if arn not in self.tasks:
                self._placed(arn, host, now)

    def _tasks(self, now: datetime) -> None:
        for task in list(self.tasks.values()):
            if task.exited_at is not None:
                continue
            if task.running_at is None and now >= task.placed_at + self.restart:
                task.running_at = task.placed_at + self.restart
                self._emit(task.arn, None)
                self._note(
                    f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) running from step {task.resumed_step}"
                )
            if task.running_at is None:
                continue
            if task.stop_asked_at is not None:
                if now >= task.stop_asked_at + timedelta(seconds=task.stop_seconds):
                    self._commit(task, task.stop_asked_at + timedelta(seconds=task.stop_seconds))
                    self._exit(task, 75, None)
                continue
            for due in self._commits_due(task, now):
                self._commit(task, due)
            if task.step_at(now, self.total_steps) >= self.total_steps:
                self._commit(task, now)
                self._exit(task, 0, "Essential container in task exited")

    def _placed(self, arn: str, host: str, now: datetime) -> None:
        described = self.world.cluster.tasks([arn]).get(arn)
        if described is None:
            return
        env: dict[str, str] = {}
        for c in (described.get("overrides") or {}).get("containerOverrides") or []:
            env |= {e["name"]: e["value"] for e in c.get("environment") or []}
        job_id, attempt = env.get("SPOTGUARD_JOB_ID", ""), int(env.get("SPOTGUARD_ATTEMPT", "0"))
        book = self.books.get(job_id)
        if book is None:
            return
        resumed = book.steps.get(env.get("SPOTGUARD_RESUME_FROM", ""), 0)
        if resumed < book.newest_step:  # committed work this attempt does again
            book.steps_lost += book.newest_step - resumed
            self._note(f"{job_id}/{attempt} resumes from step {resumed}, newest committed {book.newest_step}")
        self.tasks[arn] = Task(arn, job_id, attempt, host, now, resumed)
        self._note(f"{arn[-8:]} placed: {job_id}/{attempt} on {host[-8:]}")

    def _commits_due(self, task: Task, now: datetime) -> list[datetime]:
        assert task.running_at is not None
        every = timedelta(minutes=COMMIT_MINUTES)
        due = []
        t = (task.last_commit_at or task.running_at) + every
        while t <= now:
            due.append(t)
            t += every
        if due:
            task.last_commit_at = due[-1]
        return due

    def _commit(self, task: Task, at: datetime) -> None:
        book = self.books[task.job_id]
        step = task.step_at(at, self.total_steps)
        if step <= book.newest_step and book.sequence > 0:
            return  # nothing new since the last commit
        book.sequence += 1
        job = {"job_id": book.job_id, "checkpoint_uri": book.checkpoint_uri}
        uri = self.world.commit_checkpoint(
            job, book.sequence, task.attempt, progress=step / self.total_steps, at=at, step=step
        )
        book.steps[uri] = step
        book.newest_step = max(book.newest_step, step)

    def _commit_cut(self, task: Task) -> None:
        """The instance goes while the task writes a checkpoint: the next sequence's data files reach the
        bucket, its MANIFEST.json never does (nor its event). The committed checkpoint stays the one
        before, which the next attempt must resume from (the steps it would lose are counted if not)."""
        book = self.books[task.job_id]
        bucket, prefix = book.checkpoint_uri.removeprefix("s3://").split("/", 1)
        key = f"{prefix}checkpoints/{book.sequence + 1:08d}/model.pt"
        self.world.stack.client("s3").put_object(Bucket=bucket, Key=key, Body=b"half-written")
        self._note(
            f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) cut mid-commit: s3://{bucket}/{key} "
            "written, no manifest"
        )

    def _exit(self, task: Task, code: int | None, reason: str | None) -> None:
        """The task's container exits (`code`; None: its instance is gone): ECS stops it and says so."""
        from moto.ecs.models import ecs_backends

        stack = self.world.stack
        moto_task = ecs_backends[stack.account][stack.region].tasks["gpu-spot"][task.arn]
        if moto_task.desired_status != "STOPPED":
            moto_task.stopped_reason = reason or "Essential container in task exited"
        moto_task.desired_status = moto_task.last_status = "STOPPED"
        for c in moto_task.containers:
            c.exitCode = code
        self.world.scheduler.release(task.arn)
        task.exited_at, task.exit_code = self.clock.now(), code
        self._emit(task.arn, code)
        self._note(f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) exited {code}")

    def _stop_asked(self, parsed: dict[str, Any], **_: Any) -> None:
        """SpotGuard's StopTask: ECS asks the container to stop; it runs on until it exits (moto would
        mark it stopped at once, with the exit code it defaults to)."""
        from moto.ecs.models import ecs_backends

        arn = str(((parsed or {}).get("task") or {}).get("taskArn") or "")
        task = self.tasks.get(arn)
        if task is None or task.exited_at is not None:
            return
        stack = self.world.stack
        moto_task = ecs_backends[stack.account][stack.region].tasks["gpu-spot"].get(arn)
        if moto_task is not None:
            moto_task.last_status = "RUNNING" if task.running_at is not None else "PENDING"
        self.world.scheduler.gpus[arn] = 1  # its GPU stays taken until it exits
        if task.stop_asked_at is None:
            task.stop_asked_at = self.clock.now()
            if task.running_at is None:  # stopped before it ran: it exits at once
                task.running_at = self.clock.now()

    # ------------------------------------------------------------------------------------- faults
    def _fault(self, kind: str) -> bool:
        hit = self.faults > 0 and self.chance.random() < self.faults
        if hit:
            self.faults_done[kind] += 1
        return hit

    def _emit(self, arn: str, exit_code: int | None) -> None:
        """ECS's task event, through EventBridge: at once, or (a fault) held back so that a later one
        overtakes it, and (another) delivered twice."""
        event = self.world.event(arn, exit_code=exit_code)
        now = self.clock.now()
        what = f"{arn[-8:]}'s {event['detail']['lastStatus']} event (version {event['detail']['version']})"
        if event["detail"]["lastStatus"] == "RUNNING" and self._fault("lost-running"):
            self._note(f"fault: {what} lost")  # for good: only ECS's word (DescribeTasks) says it runs
            return
        if self._fault("reordered"):
            when = now + timedelta(seconds=self.chance.uniform(1, 60))
            self._hold(when, event)
            self._note(f"fault: {what} held back to {when.isoformat()}")
        else:
            self.world.put(event)
        if self._fault("duplicated"):
            when = now + timedelta(seconds=self.chance.uniform(1, 120))
            self._hold(when, event)
            self._note(f"fault: {what} delivered again at {when.isoformat()}")

    def _hold(self, when: datetime, event: dict[str, Any]) -> None:
        heapq.heappush(self.later, (when, next(self.held), event))

    def _deliver_held(self, now: datetime) -> None:
        while self.later and self.later[0][0] <= now:
            self.world.put(heapq.heappop(self.later)[2])

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

    # ---------------------------------------------------------------------------------- the result
    def result(self) -> Result:
        lost, stuck, succeeded, unfinished = [], [], 0, 0
        cancelled, undone = 0, []
        now = self.clock.now()
        for job_id, book in self.books.items():
            with self._own():
                answer = self.world.invoke({"action": "status", "job_id": job_id})
            if not answer.get("ok"):
                lost.append(f"{job_id}: {answer.get('error', {}).get('message', 'no answer')}")
                continue
            job = answer["job"]
            if job["state"] == "succeeded":
                succeeded += 1
                continue
            if book.cancelled_at is not None:  # its user cancelled it: it must end so, and soon
                if job["state"] == "cancelled":
                    cancelled += 1
                elif (now - book.cancelled_at).total_seconds() > CANCEL_BOUND_SECONDS:
                    undone.append(f"{job_id}: {job['state']} since its cancel: {job['last_reason']}")
                else:
                    unfinished += 1
                continue
            live = any(t.exited_at is None for t in self.tasks.values() if t.job_id == job_id)
            waiting = job["state"] in ("queued", "launching") and (
                job["retry_at"] is None
                or datetime.fromisoformat(job["retry_at"]) > now - timedelta(seconds=2 * RECONCILE_SECONDS)
            )
            if job["finished"]:
                lost.append(f"{job_id}: {job['state']}: {job['last_reason']}")
            elif not live and not waiting and job["state"] != "running":
                stuck.append(f"{job_id}: {job['state']}: {job['last_reason']}")
            elif not live and job["state"] == "running":
                stuck.append(f"{job_id}: running with no task: {job['last_reason']}")
            else:
                unfinished += 1
        twice = self._twice_at_once()
        dead_count, dead = self._dead_letter_lines()
        self._heard()
        text = "\n".join(self.log)
        return Result(
            jobs=len(self.books),
            succeeded=succeeded,
            unfinished=unfinished,
            lost=lost,
            twice_at_once=twice,
            steps_lost=sum(b.steps_lost for b in self.books.values()),
            dead_letters=dead_count,
            dead_letter_lines=dead,
            stuck=stuck,
            cancelled=cancelled,
            cancels_undone=undone,
            interruptions=self.interruptions,
            tasks=len(self.tasks),
            virtual_hours=round((now - START).total_seconds() / 3600, 2),
            digest=hashlib.sha256(text.encode()).hexdigest()[:16],
            timeline=list(self.log),
            faults=self._faults_played(),
            stopped_early=self.stopped_early,
        )

    def _faults_played(self) -> dict[str, int]:
        played = dict(self.faults_done)
        if self.injector is not None:
            played |= {k: self.injector.fired[k] for k in CALL_FAULTS}
        return played

    def _twice_at_once(self) -> list[str]:
        return alive_at_once(list(self.tasks.values()), self.clock.now())

    def _dead_letters(self) -> int:
        return self._dead_letter_lines()[0]

    def _dead_letter_lines(self) -> tuple[int, list[str]]:
        """Every message in a dead-letter queue: the queue, and SpotGuard's reason when it rejected the
        message, or the body when SQS moved it after maxReceiveCount failed receives."""
        sqs = self.world.stack.client("sqs")
        count, lines = 0, []
        for url in sqs.list_queues().get("QueueUrls", []):
            if "DeadLetter" in url or "DLQ" in url or "Dlq" in url:
                messages = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=0
                ).get("Messages", [])
                for m in messages:
                    reason = (m.get("MessageAttributes") or {}).get("spotguard-reject-reason") or {}
                    why = reason.get("StringValue") or f"after maxReceiveCount: {m['Body'][:300]}"
                    lines.append(f"{url.rsplit('/', 1)[-1]}: {why}")
                attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                held = max(len(messages), int(attrs["Attributes"]["ApproximateNumberOfMessages"]))
                count += held
                lines += (
                    [f"{url.rsplit('/', 1)[-1]}: {held - len(messages)} more"] if held > len(messages) else []
                )
        return count, lines


def alive_at_once(tasks: list[Task], end: datetime) -> list[str]:
    """Two tasks of one (one-node) job alive at the same time, each from its placement to its exit (`end`
    for one still alive): two attempts, or two tasks of one attempt (a RunTask made twice, its first task
    left running)."""
    out = []
    by_job: dict[str, list[Task]] = {}
    for t in tasks:
        by_job.setdefault(t.job_id, []).append(t)
    for job_id, mine in sorted(by_job.items()):
        for a, b in itertools.combinations(sorted(mine, key=lambda t: t.placed_at), 2):
            if b.placed_at < (a.exited_at or end):
                when = b.placed_at.isoformat()
                which = f"attempt {b.attempt}" if a.attempt != b.attempt else f"a second task of {b.attempt}"
                out.append(f"{job_id}: {which} placed at {when} while {a.attempt} ran ({a.arn[-8:]})")
    return out


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


def soak(plan: Plan, say: Callable[[str], None], log: TextIO | None = None) -> Result:
    """One soak, start to end, in this process; the functions' logs to `log`."""
    from spotguard_cli.emulator.vclock import VirtualClock

    clock = VirtualClock(START)
    with virtual_system(clock, plan.seed, log) as (world, denied, cold):
        run = Soak(world, clock, plan, say)
        run.run()
        result = run.result()
        result.denied = sorted({str(d) for g in denied() for d in g.denied})
        result.cold_starts = cold.starts
        return result


@contextlib.contextmanager
def virtual_system(
    clock: VirtualClock, seed: int, log: TextIO | None
) -> Iterator[tuple[JobsWorld, Callable[[], list[Any]], ColdStarts]]:
    """The whole stack in this process on `clock`, for a soak or a replay: every function over moto
    (`_moto`), no host yet; every date and draw from the clock and the seed (vclock.installed); the
    functions without their threads (vclock.one_thread: which thread called first would change the
    run); each invocation taking its modelled time, cold starts counted (latency.timed_invocations);
    moto's DynamoDB scans and its dispatch quicker, with the same answers (motopatch). Yields the world,
    the role guards installed meanwhile (their `denied` calls), and the cold starts."""
    from spotguard_cli.emulator.latency import timed_invocations
    from spotguard_cli.emulator.motopatch import quicker_dispatch, quicker_dynamodb_scans
    from spotguard_cli.emulator.vclock import installed, one_thread
    from spotguard_cli.emulator.world import make_jobs_world

    # moto's EC2 loads its public AMIs (ids drawn from the seeded random) unless told not to: left to the
    # caller's environment, the same seed gave another run under pytest (which turns them off) than in a
    # shell. No run reads them; always off.
    amis_off = mock.patch.dict(os.environ, {"MOTO_EC2_LOAD_DEFAULT_AMIS": "false"})
    with amis_off, installed(clock, seed), _moto() as denied, quicker_dynamodb_scans(), one_thread():
        env = {"SPOTGUARD_RETRY_BASE_SECONDS": str(RETRY_BASE_SECONDS)}
        world = make_jobs_world(env=env, log=log, hosts=False, caught=False)
        with quicker_dispatch():  # once the stack's deployment has imported moto's services
            yield world, denied, timed_invocations(world.functions, clock, seed)


@contextlib.contextmanager
def _moto() -> Iterator[Callable[[], list[Any]]]:
    """moto in this process, ECS tasks held where they are (a task runs until it stops), every function
    held to its role's actions (emulator/iam.py); yields the role guards installed meanwhile."""
    from moto import mock_aws
    from moto.moto_api import state_manager

    from spotguard.adapters import clients
    from spotguard_cli.emulator import iam

    guards = len(iam.INSTALLED)
    with mock_aws():
        state_manager.set_transition(
            model_name="ecs::task", transition={"progression": "manual", "times": 10**9}
        )
        try:
            yield lambda: list(iam.INSTALLED[guards:])
        finally:
            state_manager.unset_transition("ecs::task")
            clients.reset()
            del iam.INSTALLED[guards:]


def run(args: argparse.Namespace) -> int:
    from spotguard_cli.emulator.boot import BOOT_SECONDS
    from spotguard_cli.local.shared import quiet_moto, same_hash_seed
    from spotguard_cli.simulator import TraceError, load_trace

    quiet_moto()
    same_hash_seed()  # the same seed, the same run: string hashing too
    try:
        traces = [load_trace(p) for p in args.trace]
    except TraceError as exc:
        print(f"spotguard local soak: {exc}", file=sys.stderr)
        return 2
    if len(traces) > len(ZONES):
        print(f"spotguard local soak: at most {len(ZONES)} traces (a pool a zone)", file=sys.stderr)
        return 2
    if len({t.gap_hours for t in traces}) > 1:
        print("spotguard local soak: the traces must have one gap_seconds", file=sys.stderr)
        return 2
    shortest = min(len(t.available) for t in traces) * traces[0].gap_hours
    hours = min(args.hours or shortest, shortest)
    hosts = args.hosts_per_pool or max(1, math.ceil(args.jobs * 0.6 / len(traces)))
    # a line a virtual day, seen at once also through a pipe (`| tee`): a long run says how far it got
    say = (lambda _: None) if args.json else functools.partial(print, flush=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (STATE_DIR / "functions.log").open("w") as log:
        plan = Plan(
            traces,
            args.jobs,
            args.job_hours,
            hours,
            hosts,
            args.seed,
            args.faults,
            args.call_faults,
            boot_seconds=BOOT_SECONDS if args.boot_seconds is None else args.boot_seconds,
        )
        result = soak(plan, say, log)
        (STATE_DIR / "timeline.log").write_text("\n".join(result.timeline) + "\n")
    if args.json:
        shown = {k: v for k, v in result.__dict__.items() if k != "timeline"}
        print(json.dumps(shown | {"ok": result.ok}, indent=2))
    else:
        print(render(result))
    return 0 if result.ok else 1


def render(r: Result) -> str:
    lines = [
        f"soak: {r.jobs} jobs, {r.virtual_hours} h of traces, {r.interruptions} spot warnings, "
        f"{r.tasks} tasks, faults {', '.join(f'{k} {n}' for k, n in r.faults.items()) or 'none'}",
        f"  jobs succeeded             {r.succeeded}",
        f"  jobs still at work         {r.unfinished}  (running or waiting when the "
        + ("run was stopped (Ctrl-C))" if r.stopped_early else "hours ran out)"),
        f"  jobs lost                  {len(r.lost)}",
        f"  jobs cancelled by the user {r.cancelled}",
        f"  cancels not done           {len(r.cancels_undone)}",
        f"  attempts running at once   {len(r.twice_at_once)}",
        f"  committed steps lost       {r.steps_lost}",
        f"  dead letters               {r.dead_letters}",
        f"  jobs stuck                 {len(r.stuck)}",
        f"  calls refused by a role    {len(r.denied)}",
        f"  cold starts                {r.cold_starts}",
        f"  run digest                 {r.digest}",
    ]
    lines += [f"    lost: {x}" for x in r.lost[:10]] + [f"    at once: {x}" for x in r.twice_at_once[:10]]
    lines += [f"    stuck: {x}" for x in r.stuck[:10]] + [f"    refused: {x}" for x in r.denied[:10]]
    lines += [f"    cancel not done: {x}" for x in r.cancels_undone[:10]]
    lines += [f"    dead letter: {x}" for x in r.dead_letter_lines[:10]]
    lines.append(
        f"timeline: {STATE_DIR / 'timeline.log'}; the functions' logs: {STATE_DIR / 'functions.log'}"
    )
    return "\n".join(lines)

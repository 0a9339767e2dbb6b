"""What a soak models: the plan it runs, the tasks and jobs it follows (`Task`, `JobBook`), the result it
counts (`Result`), and the model's timings (a task's restart, steps, commits and stop, spot's warning, the
reconcile schedule); the soak's loop is loop.py, the command local/soak.py."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
SUBMIT_RETRY_SECONDS = 60  # a user's CLI submits again after a failed invocation
CANCEL_AFTER_HOURS = (1.0, 3.0)  # a job drawn to be cancelled: that long after its submit
CANCEL_REASON = "soak: cancelled by the user"
CANCEL_BOUND_SECONDS = 1800  # a cancel asked this long before the end must have ended its job
SUBMIT_HOURS = 6.0  # the jobs are submitted over the first hours (the first half of a shorter run)


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
class SoakPlan:
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

"""The live half of a replay: the local stack on one scaled clock that starts at the traces' first tick,
the pools following the traces (world.py), and the jobs (task.py) submitted at their starts. While no job
is live the clock jumps from tick to tick instead of waiting, playing only the pools' events."""

from __future__ import annotations

import heapq
import itertools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotguard.domain.jobs.model import TERMINAL
from spotguard_cli.answers import StatusView, read_answer

if TYPE_CHECKING:
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.local.replay.world import ReplayWorld
    from spotguard_cli.simulator import Job, Prices, Trace

WARM_UP_HOURS = 48.0  # the pools' events played before the first start: SpotGuard has been watching
STEP_MINUTES = 5.0  # a job's step of work
CHECKPOINT_MINUTES = 30.0  # the agent's interval between checkpoints, in trace time


@dataclass
class JobRun:
    job_id: str
    start_tick: int
    submitted_at: datetime
    deadline: datetime
    status: StatusView = field(default_factory=StatusView)  # read at the end of the run
    logs: list[str] = field(default_factory=list)  # its attempts' task logs, in order


@dataclass(order=True)
class _Action:
    when: datetime
    order: int
    what: str = field(compare=False)
    run: Callable[[], None] = field(compare=False)


def run_live(
    traces: list[Trace],
    job: Job,
    starts: list[int],
    seconds_per_hour: float,
    prices: Prices,
    work: Path,
    say: Callable[[str], None],
) -> tuple[list[JobRun], dict[str, Any]]:
    """Run the jobs starting at the ticks `starts` on the live stack; the jobs (their status and task logs
    read at the end, in the order of `starts`) and what the run saw (pids, the world's counts, dead
    letters, calls refused by a role, its wall-clock time)."""
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.local.replay.world import EPOCH, ReplayWorld

    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("task-*.log"):
        old.unlink()
    gap = timedelta(hours=traces[0].gap_hours)
    scale = 3600.0 / seconds_per_hour
    warm = math.ceil(WARM_UP_HOURS / traces[0].gap_hours)
    first = max(0, min(starts) - warm)
    last = max(starts) + math.ceil(job.deadline_hours / traces[0].gap_hours)
    end_tick = min(len(t.available) for t in traces)  # a job still running at the trace's end is a miss
    facts: dict[str, Any] = {"time_scale": scale, "wall_seconds": 0.0}
    began = time.monotonic()
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        say(f"moto server on {moto.endpoint}; one spot pool per trace, and on-demand")
        # The clock starts a little before the first tick (setting up takes some of its time) and jumps.
        system = LocalSystem(
            moto.endpoint,
            work,
            time_scale=scale,
            clock_start=EPOCH + gap * first - timedelta(hours=6),
            schedule_aside=True,
        )
        try:
            world = ReplayWorld(system, traces, len(starts), prices)
            world.build()
            system.pump()
            counts = system.functions["ReconcileFunction"].invoke({"id": "local-schedule"})
            say(f"{counts.get('pools', 0)} pools discovered; SpotGuard's clock runs {scale:g}x")
            td = _task_definition(system, job, scale)
            jobs: list[JobRun] = []
            ticks = (first, min(last, end_tick))
            actions = _actions(system, world, traces, job, starts, ticks, td, jobs, say)
            system.clock.jump_to(world.at(first))
            _drive(system, world, actions, jobs, len(starts), world.at(end_tick), say)
            _read_back(system, world, moto, jobs, work, facts)
        finally:
            system.close()
    facts["wall_seconds"] = round(time.monotonic() - began, 1)
    jobs.sort(key=lambda j: int(j.job_id.rsplit("-", 1)[1]))
    return jobs, facts


def _task_definition(system: LocalSystem, job: Job, scale: float) -> str:
    """The replay's task definition: the modelled training task (task.py), its work, restart and steps the
    job's, checkpointing every CHECKPOINT_MINUTES of trace time on the scaled clock."""
    return system.task_definition(
        [
            sys.executable,
            "-m",
            "spotguard_cli.local.replay.task",
            "--work-hours",
            f"{job.hours:g}",
            "--restart-hours",
            f"{job.restart_hours:g}",
            "--step-minutes",
            f"{STEP_MINUTES:g}",
        ],
        environment={"SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": f"{CHECKPOINT_MINUTES * 60 / scale:.4f}"},
        family="replay",
    )


def _actions(
    system: LocalSystem,
    world: ReplayWorld,
    traces: list[Trace],
    job: Job,
    starts: list[int],
    ticks: tuple[int, int],
    td: str,
    jobs: list[JobRun],
    say: Callable[[str], None],
) -> list[_Action]:
    """The run's actions, a heap by time: each tick of `ticks` (first, end) and, after the first, the
    spot warning before it; each job's submit a second after its start's tick (appending it to `jobs`)."""
    from spotguard_cli.local.replay.world import WARNING

    first, end = ticks
    actions: list[_Action] = []
    order = itertools.count()

    def add(when: datetime, what: str, fn: Callable[[], None]) -> None:
        heapq.heappush(actions, _Action(when, next(order), what, fn))

    for i in range(first, end):
        add(world.at(i), f"tick {i}", lambda i=i: world.tick(i))
        if i > first:
            add(world.at(i) - WARNING, f"warn {i}", lambda i=i: world.warn(i))

    def submit(k: int, tick: int) -> None:
        at = world.at(tick)
        run = JobRun(f"replay-{k + 1}", tick, system.clock.now(), at + timedelta(hours=job.deadline_hours))
        answer = system.invoke_jobs(
            {
                "action": "submit",
                "job_id": run.job_id,
                "request": {"cluster": "gpu-spot", "taskDefinition": td},
                "options": {
                    "deadline": run.deadline.isoformat(),
                    "work_hours": job.hours,
                    "max_attempts": 100,
                },
            }
        )
        if not read_answer(answer).ok:
            raise RuntimeError(f"submit failed: {answer}")
        jobs.append(run)
        say(f"{run.job_id} submitted at trace hour {tick * traces[0].gap_hours:.1f}")

    for k, tick in enumerate(starts):
        add(
            world.at(tick) + timedelta(seconds=1),
            f"submit {k}",
            lambda k=k, tick=tick: submit(k, tick),
        )
    return actions


def _read_back(
    system: LocalSystem,
    world: ReplayWorld,
    moto: MotoServer,
    jobs: list[JobRun],
    work: Path,
    facts: dict[str, Any],
) -> None:
    """What the run saw, into `facts` (pids, the world's counts, dead letters, calls refused by a role), and
    each job's status and its attempts' task logs."""
    facts["pids"] = [moto.proc.pid if moto.proc else None, *system.runner.pids]
    facts["world"] = dict(world.counts)
    facts["dead_letters"] = system.dead_letters()
    facts["denied"] = [str(d) for d in system.guard.denied]  # calls a function's role lacks
    for run in jobs:
        run.status = system.job_status(run.job_id)
        run.logs = [_task_log(work, a.task_arn) for a in run.status.attempts]


def _drive(
    system: Any,
    world: Any,
    actions: list[_Action],
    jobs: list[JobRun],
    n_jobs: int,
    trace_end: datetime,
    say: Callable[[str], None],
) -> None:
    """Run the actions at their times; while no job is live, jump the clock to the next one."""
    live: set[str] = set()
    checked = 0.0
    take_away_at: float | None = None
    while True:
        now = system.clock.now()
        while actions and actions[0].when <= now:
            action = heapq.heappop(actions)
            action.run()
            if action.what.startswith("tick"):
                take_away_at = time.monotonic()  # the instances of pools that lost spot go now (or soon)
            if action.what.startswith("submit"):
                live.add(jobs[-1].job_id)
        if take_away_at is not None and time.monotonic() >= take_away_at:
            wait = world.take_away()
            take_away_at = time.monotonic() + wait if wait else None
        if time.monotonic() - checked > 0.5 and live:
            checked = time.monotonic()
            for run in jobs:
                if run.job_id in live:
                    state = system.job_state(run.job_id)
                    if state in TERMINAL:
                        live.discard(run.job_id)
                        say(f"{run.job_id} {state}")
        if len(jobs) == n_jobs and not live:
            return
        if now >= trace_end:
            say("the trace ended with jobs still running: they count as missed")
            return
        if not live and actions and take_away_at is None:
            # Idle: the pools' events more than the warm-up before the next start are skipped (the
            # ledger keeps a pool's newest facts only); the first tick after the skip makes every pool
            # what its trace says then.
            starts = [a.when for a in actions if a.what.startswith("submit")]
            skip_to = min(starts) - timedelta(hours=WARM_UP_HOURS) if starts else None
            while skip_to is not None and actions and actions[0].when < skip_to:
                heapq.heappop(actions)
            system.pump()
            nxt = actions[0].when
            if nxt > system.clock.now():
                system.clock.jump_to(nxt)
            continue
        system.pump()
        time.sleep(0.02)


def _task_log(work: Path, task_arn: str) -> str:
    path = work / f"task-{task_arn.rsplit('/', 1)[-1][:8]}.log"
    return path.read_text() if path.exists() else ""

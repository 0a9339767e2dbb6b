"""`spotguard local replay`: the whole local stack on the clock of real spot availability traces, and what
it costs beside what `spotguard simulate` says for the same policy, traces and starts.

The stack (moto server on 127.0.0.1, every function, the pollers, the reconcile schedule) runs on one
scaled clock (`--time-scale` wall-clock seconds per trace hour) that starts at the trace's first tick;
the pools follow the traces (replay/world.py); N jobs (replay/task.py, with the real agent) are
submitted at the start times `spotguard simulate --seed S --samples N` draws (pools together), each
with `work_hours` C and a deadline R hours after its start. While no job is live (before the first, between
them, after the last) the clock jumps from tick to tick instead of waiting, playing only the pools'
events, so the run takes about N x R x the time scale of wall-clock time, not the trace's length.

The result per job and in total: cost (the job's own spend: each attempt's hours at its pool's price,
restart overheads included), deadline met or missed, launches, interruptions, moves, work redone, beside
the simulator's cost and launches for the same start (`--json` prints both, and the proof).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spotguard_cli.simulator import Job, Prices, Trace, TraceError, check_job, load_trace

TERMINAL = ("succeeded", "failed", "gave-up", "cancelled")
WARM_UP_HOURS = 48.0  # the pools' events played before the first start: SpotGuard has been watching
STEP_MINUTES = 5.0  # a job's step of work
CHECKPOINT_MINUTES = 30.0  # the agent's interval between checkpoints, in trace time
STATE_DIR = Path(".local-stack") / "replay"


@dataclass
class JobRun:
    job_id: str
    start_tick: int
    submitted_at: datetime
    deadline: datetime
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(order=True)
class _Action:
    when: datetime
    order: int
    what: str = field(compare=False)
    run: Callable[[], None] = field(compare=False)


def add_parser(actions: Any) -> None:
    from spotguard_cli.simulate import _count, _positive, _seed, one_line_errors

    r = actions.add_parser(
        "replay",
        help="the local stack on real spot traces: the live system's cost beside the simulator's",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--trace", action="append", required=True, metavar="FILE", help="a spot pool; repeat")
    r.add_argument("--jobs", type=_count, required=True, metavar="N", help="jobs, at the seed's starts")
    r.add_argument("--job-hours", type=_positive("--job-hours"), required=True, metavar="C")
    r.add_argument("--deadline-hours", type=_positive("--deadline-hours"), required=True, metavar="R")
    r.add_argument(
        "--restart-hours", type=_positive("--restart-hours", strict=False), required=True, metavar="D"
    )
    r.add_argument("--seed", type=_seed, required=True, metavar="S")
    r.add_argument(
        "--time-scale",
        type=_positive("--time-scale"),
        default=4.0,
        metavar="SECONDS_PER_TRACE_HOUR",
        help="wall-clock seconds per hour of the trace (default 4: a 60-hour deadline in 4 minutes)",
    )
    r.add_argument("--json", action="store_true", help="the result, the simulator's and the proof as JSON")
    r.set_defaults(run=run)
    one_line_errors(r, "spotguard local replay")


def run(args: argparse.Namespace) -> int:
    try:
        traces = [load_trace(path) for path in args.trace]
        job = Job(args.job_hours, args.deadline_hours, args.restart_hours)
        check(traces, job, args.time_scale)
    except (TraceError, ValueError) as exc:
        print(f"spotguard local replay: {exc}", file=sys.stderr)
        return 2
    say = (lambda _: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    result = replay(traces, job, args.jobs, args.seed, args.time_scale, STATE_DIR, say)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0 if result["ok"] else 1


def check(traces: list[Trace], job: Job, seconds_per_hour: float) -> None:
    from spotguard_cli.local.replay.world import ZONES

    check_job(job, traces)
    if len(traces) > len(ZONES):
        raise ValueError(f"at most {len(ZONES)} traces (one zone each), not {len(traces)}")
    if not 0.5 <= seconds_per_hour <= 3600:
        raise ValueError(
            f"--time-scale must be within [0.5, 3600] seconds per trace hour, not {seconds_per_hour:g}"
        )
    if len({t.name for t in traces}) < len(traces):
        raise ValueError("the same trace twice")


# ================================================================================== the replay
def replay(
    traces: list[Trace],
    job: Job,
    n_jobs: int,
    seed: int,
    seconds_per_hour: float,
    work: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Run the replay and the simulator for the same starts; the result as `render` and --json show it."""
    from spotguard_cli.simulate import draw_starts, run_one

    prices = Prices()
    runs = draw_starts(traces, job, n_jobs, seed, multi_pool=len(traces) > 1)
    simulated = [run_one("spotguard", traces, r, job, prices) for r in runs]
    live, facts = _live(traces, job, [r.start for r in runs], seconds_per_hour, prices, work, say)
    rows = []
    for r, sim, lj in zip(runs, simulated, live, strict=True):
        rows.append(
            {"start_hours": round(r.start * traces[0].gap_hours, 2), **_live_row(lj), **_sim_row(sim)}
        )
    return _summary(rows, traces, job, n_jobs, seed, seconds_per_hour, facts)


def _live(
    traces: list[Trace],
    job: Job,
    starts: list[int],
    seconds_per_hour: float,
    prices: Prices,
    work: Path,
    say: Callable[[str], None],
) -> tuple[list[JobRun], dict[str, Any]]:
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.local.replay.world import EPOCH, WARNING, ReplayWorld

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
            td = system.task_definition(
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
                environment={
                    "SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": f"{CHECKPOINT_MINUTES * 60 / scale:.4f}"
                },
                family="replay",
            )
            jobs: list[JobRun] = []
            actions: list[_Action] = []
            order = itertools.count()

            def add(when: datetime, what: str, fn: Callable[[], None]) -> None:
                heapq.heappush(actions, _Action(when, next(order), what, fn))

            for i in range(first, min(last, end_tick)):
                add(world.at(i), f"tick {i}", lambda i=i: world.tick(i))
                if i > first:
                    add(world.at(i) - WARNING, f"warn {i}", lambda i=i: world.warn(i))

            def submit(k: int, tick: int) -> None:
                at = world.at(tick)
                run = JobRun(
                    f"replay-{k + 1}", tick, system.clock.now(), at + timedelta(hours=job.deadline_hours)
                )
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
                if not answer.get("ok"):
                    raise RuntimeError(f"submit failed: {answer}")
                jobs.append(run)
                say(f"{run.job_id} submitted at trace hour {tick * traces[0].gap_hours:.1f}")

            for k, tick in enumerate(starts):
                add(
                    world.at(tick) + timedelta(seconds=1),
                    f"submit {k}",
                    lambda k=k, tick=tick: submit(k, tick),
                )
            system.clock.jump_to(world.at(first))
            _drive(system, world, actions, jobs, len(starts), world.at(end_tick), say)
            facts["pids"] = [moto.proc.pid if moto.proc else None, *system.runner.pids]
            facts["world"] = dict(world.counts)
            facts["dead_letters"] = system.dead_letters()
            facts["denied"] = [str(d) for d in system.guard.denied]  # calls a function's role lacks
            for run in jobs:
                run.status = dict(system.invoke_jobs({"action": "status", "job_id": run.job_id})["job"])
                run.status["_logs"] = [
                    _task_log(work, a["task_arn"]) for a in run.status.get("attempts") or []
                ]
        finally:
            system.close()
    facts["wall_seconds"] = round(time.monotonic() - began, 1)
    jobs.sort(key=lambda j: int(j.job_id.rsplit("-", 1)[1]))
    return jobs, facts


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


# ================================================================================== the results
def _hours(a: dict[str, Any]) -> float:
    start, stop = a.get("started_at"), a.get("stopped_at")
    if not start or not stop:
        return 0.0
    t0, t1 = (datetime.fromisoformat(str(v).replace("Z", "+00:00")) for v in (start, stop))
    return max(0.0, (t1 - t0).total_seconds() / 3600)


def _at_once(attempts: list[dict[str, Any]]) -> int:
    """The most attempts of one job that ran at the same time (from ECS's start and stop times): 1 when
    a job never runs twice at once."""
    edges: list[tuple[datetime, int]] = []
    for a in attempts:
        start, stop = a.get("started_at"), a.get("stopped_at")
        if not start:
            continue
        edges.append((datetime.fromisoformat(str(start).replace("Z", "+00:00")), 1))
        if stop:
            edges.append((datetime.fromisoformat(str(stop).replace("Z", "+00:00")), -1))
    running = most = 0
    for _, step in sorted(edges):  # a stop and a start at the same instant: the stop first
        running += step
        most = max(most, running)
    return most


def _live_row(run: JobRun) -> dict[str, Any]:
    s = run.status
    attempts = [a for a in s.get("attempts") or [] if a.get("started_at")]
    stops = [
        datetime.fromisoformat(str(a["stopped_at"]).replace("Z", "+00:00"))
        for a in attempts
        if a.get("stopped_at")
    ]
    finished = max(stops) if stops and s.get("state") == "succeeded" else None
    logs = s.get("_logs") or []
    executed = sum(len(re.findall(r"^step \d+ done", t, re.MULTILINE)) for t in logs)
    needed = None
    finished_step = [re.findall(r"^step (\d+) done", t, re.MULTILINE) for t in logs]
    if s.get("state") == "succeeded" and finished_step and finished_step[-1]:
        needed = int(finished_step[-1][-1]) + 1
    lost_commit = False  # an attempt that resumed before the newest step committed before it
    newest = -1
    for t in logs:
        resumed = re.search(r"^resumed after step (-?\d+)", t, re.MULTILINE)
        if resumed is not None and int(resumed.group(1)) < newest:
            lost_commit = True
        if resumed is None and newest >= 0 and "step" in t:
            lost_commit = True  # started fresh although a checkpoint was committed
        commits = [int(c) for c in re.findall(r"^committed step (-?\d+)", t, re.MULTILINE)]
        newest = max([newest, *commits])
    spot = sum(_hours(a) for a in attempts if "spot" in (a.get("lifecycle"), a.get("market")))
    spend = s.get("spend") or {}
    return {
        "job_id": run.job_id,
        "state": s.get("state"),
        "cost": spend.get("dollars"),
        "met": finished is not None and finished <= run.deadline,
        "finished_hours": round((finished - run.submitted_at).total_seconds() / 3600, 3)
        if finished
        else None,
        "launches": len(s.get("attempts") or []),
        "interruptions": sum(1 for a in s.get("attempts") or [] if a.get("interrupted_by")),
        "moves": s.get("moves_made", 0),
        "spot_hours": round(spot, 3),
        "on_demand_hours": round(sum(_hours(a) for a in attempts) - spot, 3),
        "steps_redone": executed - needed if needed is not None else None,
        "work_lost_hours": round((executed - needed) * STEP_MINUTES / 60, 3) if needed is not None else None,
        "decisions": [
            {k: d.get(k) for k in ("at", "trigger", "placement", "pool", "reason", "expected_cost")}
            for d in s.get("decisions") or []
        ],
        "lost_committed_step": lost_commit,
        "attempts_at_once": _at_once(attempts),
    }


def _sim_row(sim: Any) -> dict[str, Any]:
    return {
        "sim_cost": round(sim.cost, 4),
        "sim_met": not sim.missed,
        "sim_launches": sim.launches,
        "sim_spot_billed_hours": round(sim.spot_billed_hours, 3),
        "sim_on_demand_billed_hours": round(sim.ondemand_billed_hours, 3),
    }


def _summary(
    rows: list[dict[str, Any]],
    traces: list[Trace],
    job: Job,
    n_jobs: int,
    seed: int,
    seconds_per_hour: float,
    facts: dict[str, Any],
) -> dict[str, Any]:
    costs = [r["cost"] for r in rows if r["cost"] is not None]
    sims = [r["sim_cost"] for r in rows]
    live_mean = sum(costs) / len(costs) if len(costs) == len(rows) and rows else None
    sim_mean = sum(sims) / len(sims) if sims else 0.0
    proof = [
        ("every job finished by its deadline", all(r["met"] for r in rows)),
        ("no committed step lost", not any(r["lost_committed_step"] for r in rows)),
        ("never two attempts of a job at once", all(r["attempts_at_once"] <= 1 for r in rows)),
        ("nothing in any dead-letter queue", not any((facts.get("dead_letters") or {}).values())),
        ("every AWS call allowed by its function's role", not facts.get("denied")),
    ]
    return {
        "ok": all(p for _, p in proof),
        "traces": [t.name for t in traces],
        "job": {"hours": job.hours, "deadline_hours": job.deadline_hours, "restart_hours": job.restart_hours},
        "jobs": n_jobs,
        "seed": seed,
        "seconds_per_trace_hour": seconds_per_hour,
        "mean_cost": round(live_mean, 4) if live_mean is not None else None,
        "sim_mean_cost": round(sim_mean, 4),
        "cost_ratio": round(live_mean / sim_mean, 4) if live_mean is not None and sim_mean else None,
        "rows": rows,
        "proof": [{"check": c, "passed": p} for c, p in proof],
        "facts": facts,
    }


def render(result: dict[str, Any]) -> str:
    j = result["job"]
    lines = [
        f"replay of {', '.join(result['traces'])}: {result['jobs']} job(s) of C={j['hours']:g} h, "
        f"R={j['deadline_hours']:g} h, D={j['restart_hours']:g} h (seed {result['seed']}), "
        f"{result['seconds_per_trace_hour']:g} s per trace hour, {result['facts']['wall_seconds']:.0f} s",
        "",
        f"{'job':<10} {'start h':>8} {'cost $':>8} {'sim $':>8} {'diff':>7} {'met':>4} {'launch':>6} "
        f"{'sim':>4} {'intr':>4} {'moves':>5} {'spot h':>7} {'od h':>6} {'redone':>6}",
    ]
    for r in result["rows"]:
        cost = f"{r['cost']:.2f}" if r["cost"] is not None else "-"
        diff = (
            f"{(r['cost'] / r['sim_cost'] - 1) * 100:+.1f}%"
            if r["cost"] is not None and r["sim_cost"]
            else "-"
        )
        lines.append(
            f"{r['job_id']:<10} {r['start_hours']:>8.1f} {cost:>8} {r['sim_cost']:>8.2f} {diff:>7} "
            f"{'yes' if r['met'] else 'NO':>4} {r['launches']:>6} {r['sim_launches']:>4} "
            f"{r['interruptions']:>4} "
            f"{r['moves']:>5} {r['spot_hours']:>7.2f} {r['on_demand_hours']:>6.2f} "
            f"{r['steps_redone'] if r['steps_redone'] is not None else '-':>6}"
        )
    mean = f"${result['mean_cost']:.2f}" if result["mean_cost"] is not None else "-"
    ratio = f" ({(result['cost_ratio'] - 1) * 100:+.1f}%)" if result["cost_ratio"] else ""
    lines += ["", f"mean cost: live {mean}, simulator ${result['sim_mean_cost']:.2f}{ratio}", "", "proof:"]
    lines += [f"  [{'ok' if p['passed'] else 'FAILED'}] {p['check']}" for p in result["proof"]]
    return "\n".join(lines)

"""What a replay found: a row per job from its status and task logs (cost, deadline, launches, work
redone), beside the simulator's for the same start; the summary and its proof; the table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spotguard_cli.local.replay.schedule import STEP_MINUTES

if TYPE_CHECKING:
    from spotguard_cli.answers import AttemptView
    from spotguard_cli.local.replay.schedule import JobRun
    from spotguard_cli.simulator import Job, Trace


# what the replay's JSON says of each capacity decision
DECISION_FIELDS = {"at", "trigger", "placement", "pool", "reason", "expected_cost"}


def _hours(a: AttemptView) -> float:
    if a.started_at is None or a.stopped_at is None:
        return 0.0
    return max(0.0, (a.stopped_at - a.started_at).total_seconds() / 3600)


def _at_once(attempts: list[AttemptView]) -> int:
    """The most attempts of one job that ran at the same time (from ECS's start and stop times): 1 when
    a job never runs twice at once."""
    edges: list[tuple[datetime, int]] = []
    for a in attempts:
        if a.started_at is None:
            continue
        edges.append((a.started_at, 1))
        if a.stopped_at is not None:
            edges.append((a.stopped_at, -1))
    running = most = 0
    for _, step in sorted(edges):  # a stop and a start at the same instant: the stop first
        running += step
        most = max(most, running)
    return most


@dataclass(frozen=True)
class Work:
    """A job's steps: how many its attempts ran, how many the work needed (None: it did not finish), and
    whether an attempt resumed behind the newest step committed before it."""

    executed: int
    needed: int | None
    lost_commit: bool


def work_of_logs(logs: list[str], succeeded: bool) -> Work:
    """The work from the task logs of a wall-clock replay's jobs (task.py's lines, attempt after attempt)."""
    executed = sum(len(re.findall(r"^step \d+ done", t, re.MULTILINE)) for t in logs)
    needed = None
    finished_step = [re.findall(r"^step (\d+) done", t, re.MULTILINE) for t in logs]
    if succeeded and finished_step and finished_step[-1]:
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
    return Work(executed, needed, lost_commit)


def live_row(run: JobRun, work: Work | None = None) -> dict[str, Any]:
    """A job's row from its status, and its work (default: read from its task logs)."""
    s = run.status
    attempts = [a for a in s.attempts if a.started_at]
    stops = [a.stopped_at for a in attempts if a.stopped_at is not None]
    finished = max(stops) if stops and s.state == "succeeded" else None
    work = work or work_of_logs(run.logs, s.state == "succeeded")
    executed, needed, lost_commit = work.executed, work.needed, work.lost_commit
    spot = sum(_hours(a) for a in attempts if "spot" in (a.lifecycle, a.market))
    return {
        "job_id": run.job_id,
        "state": s.state,
        "cost": s.spend.dollars if s.spend is not None else None,
        "met": finished is not None and finished <= run.deadline,
        "finished_hours": round((finished - run.submitted_at).total_seconds() / 3600, 3)
        if finished
        else None,
        "launches": len(s.attempts),
        "interruptions": sum(1 for a in s.attempts if a.interrupted_by),
        "moves": s.moves_made,
        "spot_hours": round(spot, 3),
        "on_demand_hours": round(sum(_hours(a) for a in attempts) - spot, 3),
        "steps_redone": executed - needed if needed is not None else None,
        "work_lost_hours": round((executed - needed) * STEP_MINUTES / 60, 3) if needed is not None else None,
        "decisions": [d.model_dump(mode="json", include=DECISION_FIELDS) for d in s.decisions],
        "lost_committed_step": lost_commit,
        "attempts_at_once": _at_once(attempts),
    }


def sim_row(sim: Any) -> dict[str, Any]:
    return {
        "sim_cost": round(sim.cost, 4),
        "sim_met": not sim.missed,
        "sim_launches": sim.launches,
        "sim_spot_billed_hours": round(sim.spot_billed_hours, 3),
        "sim_on_demand_billed_hours": round(sim.ondemand_billed_hours, 3),
    }


def summary(
    rows: list[dict[str, Any]],
    traces: list[Trace],
    job: Job,
    n_jobs: int,
    seed: int,
    seconds_per_hour: float | None,
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
        + (
            "on the virtual clock"
            if result["seconds_per_trace_hour"] is None
            else f"{result['seconds_per_trace_hour']:g} s per trace hour"
        )
        + f", {result['facts']['wall_seconds']:.0f} s",
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

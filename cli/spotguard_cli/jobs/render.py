"""The jobs function's answers as a reader sees them: a job with its attempts, checkpoints, capacity
decisions and spend, or the list of jobs, as tables; and a job's timeline drawn with --plot."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from spotguard.domain.jobs.model import JobState
from spotguard.domain.jobs.spend import Spend
from spotguard_cli.answers import (
    Answer,
    AttemptView,
    NodeView,
    StatusView,
    SummaryAnswer,
    read_answer,
)
from spotguard_cli.clock import Clock

TERMINAL_STATES = {s.value for s in JobState if s.terminal}


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _short(arn: str | None) -> str:
    return arn.rsplit("/", 1)[-1][:12] if arn else "-"


def _when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}" if at else "-"


def render(answer: Answer | Mapping[str, Any]) -> str:
    """An ok answer (or its JSON) as a reader sees it: the list of jobs, a job in a few lines, or a
    status with its attempts, checkpoints, decisions and spend."""
    if not isinstance(answer, Answer):
        answer = read_answer(answer)
    if answer.jobs is not None:
        rows = [
            [j.job_id, j.state, str(j.gpus), str(j.attempts), _short(j.task_arn), _when(j.updated_at)]
            for j in answer.jobs
        ]
        return table(rows, ["JOB", "STATE", "GPUS", "ATTEMPTS", "TASK", "UPDATED"]) if rows else "no jobs"
    job = answer.job
    if job is None:
        return "no job"
    attempts = job.attempts if isinstance(answer, SummaryAnswer) else len(job.attempts) + job.folded_attempts
    stopping = answer.action == "cancel" and job.state not in TERMINAL_STATES
    state = "cancelling" if stopping else job.state
    size = f"{job.gpus} GPU" if job.nodes <= 1 else f"{job.nodes} nodes x {job.gpus} GPU"
    lines = [f"job {job.job_id}: {state}  ({size}, {attempts} attempt(s))"]
    if stopping:  # the job reads as it was until its task has stopped: no failed cancel
        tasks = "its task is" if job.nodes <= 1 else f"every one of its {job.nodes} nodes is"
        lines.append(
            f"  cancel under way: {tasks} being stopped; the job is {job.state} until it has, "
            f"then cancelled (follow it: spotguard jobs status {job.job_id} --watch)"
        )
    lines += [f"  {job.last_reason}", f"  checkpoints: {job.checkpoint_uri}"]
    if job.retry_at:
        lines.append(f"  next RunTask try: {_when(job.retry_at)}")
    if isinstance(job, StatusView):
        if job.folded_attempts:
            lines.append(
                f"  its {job.folded_attempts} oldest attempt(s) no longer kept whole (the ledger's bound); "
                "their spend is counted below"
            )
        lines += _status_lines(job)
    return "\n".join(lines)


def _status_lines(job: StatusView) -> list[str]:
    """A status's attempts, checkpoints, snapshots, capacity decisions, move under way and spend."""
    rows = [
        [
            str(a.number),
            _short(a.task_arn),
            a.instance_type or "-",
            a.availability_zone or "-",
            a.lifecycle or "-",
            _when(a.started_at),
            _when(a.stopped_at),
            a.outcome or a.last_status or "-",
        ]
        for a in job.attempts
    ]
    attempts = table(rows, ["#", "TASK", "TYPE", "ZONE", "MARKET", "STARTED", "STOPPED", "OUTCOME"])
    lines = ["", _with_nodes(attempts, job)]
    if job.checkpoints:
        newest = job.checkpoints[-1]
        lines.append(
            f"\n{len(job.checkpoints)} checkpoint(s); newest #{newest.sequence} at step {newest.step} "
            f"({newest.progress:.0%}) from attempt {newest.attempt}"
        )
    if job.snapshots:
        lines.append(f"EBS snapshots: {', '.join(job.snapshots)} (the next attempt starts from the last)")
    if job.decisions:
        rows = [
            [
                _when(d.at),
                d.trigger or "-",
                d.placement or "-",
                d.pool or "-",
                f"${d.expected_cost:.2f}" if d.expected_cost is not None else "-",
                d.reason,
            ]
            for d in job.decisions[-5:]
        ]
        lines += [
            f"\ncapacity decisions ({len(job.decisions)}, newest last; moves made: {job.moves_made}):",
            table(rows, ["AT", "WHY ASKED", "PLACEMENT", "POOL", "TO FINISH", "REASON"]),
        ]
    if job.move is not None:
        to = job.move.to
        lines.append(f"moving to {to.placement or '?'} {to.pool or ''}: waiting for its checkpoint")
    if job.spare is not None:
        s = job.spare
        lines.append(
            f"spare instance for attempt {s.attempt + 1} in {s.decision.pool or '?'} ({s.group}), asked "
            f"{_when(s.asked_at)}: {s.state}" + (f"; {s.detail}" if s.detail else "")
        )
    if job.spend is not None:
        lines.append(spend_text(job.spend))
    return lines


def _with_nodes(attempts: str, job: StatusView) -> str:
    """The attempts' table with, under each attempt of a multi-node job, what became of its gang and one
    line per node. The node lines are aligned among themselves, not with the table's columns (they say
    other things); a one-node job's table is returned as it is."""
    if not any(a.gang for a in job.attempts):
        return attempts
    header, *rows = attempts.splitlines()
    per_attempt = [_node_rows(a) for a in job.attempts]
    every = [r for node_rows in per_attempt for r in node_rows]
    aligned = iter(table(every, [""] * 7).splitlines()[1:])  # the blank header row dropped
    out = [header]
    for a, row, node_rows in zip(job.attempts, rows, per_attempt, strict=True):
        out.append(row)
        if a.gang:
            out.append(f"   gang of {a.nodes} nodes: {gang_text(a)}")
            out += [f"   {next(aligned)}" for _ in node_rows]
    return "\n".join(out)


def gang_text(a: AttemptView) -> str:
    """What became of an attempt's gang, in a phrase: formed, given up before it formed (`abandoned`),
    still forming, and whether SpotGuard stopped it whole (the nodes still running when one stopped)."""
    if a.formed_at is not None:
        said = f"formed {_when(a.formed_at)}"
    elif a.abandoned:
        said = f"given up before it formed ({a.abandoned}); not counted as an attempt"
    elif a.live:
        running = sum(1 for t in a.tasks if t.last_status == "RUNNING")
        said = f"forming: {running} of {a.nodes} nodes running"
    else:
        said = "never formed"
    if a.gang_stopped_at is not None and not a.abandoned:  # a gang given up was stopped whole, said
        said += f"; stopped whole {_when(a.gang_stopped_at)}"
    return said


def _node_rows(a: AttemptView) -> list[list[str]]:
    """One row per node of a multi-node attempt, in node order: its task, status, instance, type/zone,
    exit codes and its own verdict; a node never launched says so."""
    if not a.gang:
        return []
    tasks = {t.node: t for t in a.tasks}
    rows = []
    for k in range(max([a.nodes, *(node + 1 for node in tasks)])):
        t = tasks.get(k)
        if t is None and a.folded_peers:  # an old gang: the ledger keeps node 0's record alone
            others = f"{a.folded_peers} other node{'s' if a.folded_peers > 1 else ''}"
            note = "records not kept (an old gang's); spend counts them"
            rows.append([others, "-", "folded", "", "", "", note])
            break
        if t is None:
            later = "not launched yet" if a.live and not a.abandoned else "never launched"
            rows.append([f"node {k}", "-", later, "", "", "", ""])
            continue
        where = "/".join(x for x in (t.instance_type, t.availability_zone) if x) or "-"
        rows.append(
            [
                f"node {k}",
                _short(t.task_arn),
                t.last_status or "-",
                t.instance_id or "-",
                where,
                exit_text(t.exit_codes),
                _verdict(t),
            ]
        )
    return rows


def exit_text(codes: Mapping[str, int | None]) -> str:
    """A task's exit codes: 'exit 75' (one container), 'exit train=75, agent=0' (several), '-' (none)."""
    if not codes:
        return "-"
    if len(codes) == 1:
        (code,) = codes.values()
        return f"exit {'-' if code is None else code}"
    return "exit " + ", ".join(f"{k}={'-' if v is None else v}" for k, v in sorted(codes.items()))


VERDICT_REASON_CHARS = 70  # a node's line stays readable; --json has the whole reason


def _verdict(t: NodeView) -> str:
    if not t.verdict:
        return ""
    reason = t.verdict_reason or ""
    if len(reason) > VERDICT_REASON_CHARS:
        reason = reason[: VERDICT_REASON_CHARS - 1] + "…"
    return f"{t.verdict} ({reason})" if reason else t.verdict


def spend_text(spend: Spend | Mapping[str, Any]) -> str:
    """What a job spent, in words: 'spent 2.32 GPU-hours (0.04 lost), $0.42 ($0.01 lost)'. `spend` is a
    status's, or its JSON."""
    if not isinstance(spend, Spend):
        spend = Spend.model_validate(spend)
    money = ""
    if spend.dollars is not None:
        money = f", ${spend.dollars:.2f} (${spend.dollars_lost or 0:.2f} lost)"
    return f"spent {spend.gpu_hours:.2f} GPU-hours ({spend.gpu_hours_lost or 0:.2f} lost){money}"


def plot(path: str, answer: Answer, clock: Clock) -> bool:
    """`status --plot`: the job's timeline drawn to `path` (up to now while it runs); False, said in one
    line, when it could not be."""
    from spotguard_cli.timeline_plot import plot_job

    try:
        job = answer.status()
        plot_job(job, path, now=None if job.state in TERMINAL_STATES else clock.now())
    except (OSError, ValueError) as exc:
        print(f"spotguard jobs status: --plot: {exc}".splitlines()[0], file=sys.stderr)
        return False
    print(f"timeline written to {path}", file=sys.stderr)
    return True

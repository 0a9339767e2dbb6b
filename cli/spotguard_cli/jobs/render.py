"""The jobs function's answers as a reader sees them: a job with its attempts, checkpoints, capacity
decisions and spend, or the list of jobs, as tables; and a job's timeline drawn with --plot."""

from __future__ import annotations

import sys
from typing import Any

from spotguard.domain.jobs.model import JobState
from spotguard_cli.clock import Clock

TERMINAL_STATES = {s.value for s in JobState if s.terminal}


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _short(arn: str | None) -> str:
    return arn.rsplit("/", 1)[-1][:12] if arn else "-"


def _when(iso: str | None) -> str:
    return iso[:19].replace("T", " ") if iso else "-"


def render(answer: dict[str, Any]) -> str:
    if answer.get("jobs") is not None:
        rows = [
            [
                j["job_id"],
                j["state"],
                str(j["gpus"]),
                str(j["attempts"]),
                _short(j["task_arn"]),
                _when(j["updated_at"]),
            ]
            for j in answer["jobs"]
        ]
        return table(rows, ["JOB", "STATE", "GPUS", "ATTEMPTS", "TASK", "UPDATED"]) if rows else "no jobs"
    job = answer["job"]
    attempts = job["attempts"] if isinstance(job["attempts"], int) else len(job["attempts"])
    stopping = answer.get("action") == "cancel" and job.get("state") not in TERMINAL_STATES
    state = "cancelling" if stopping else job["state"]
    lines = [f"job {job['job_id']}: {state}  ({job['gpus']} GPU, {attempts} attempt(s))"]
    if stopping:  # the job reads as it was until its task has stopped: no failed cancel
        lines.append(
            f"  cancel under way: its task is being stopped; the job is {job['state']} until it has, "
            f"then cancelled (follow it: spotguard jobs status {job['job_id']} --watch)"
        )
    lines += [f"  {job['last_reason']}", f"  checkpoints: {job['checkpoint_uri']}"]
    if job.get("retry_at"):
        lines.append(f"  next RunTask try: {_when(job['retry_at'])}")
    if isinstance(job.get("attempts"), list):
        rows = [
            [
                str(a["number"]),
                _short(a["task_arn"]),
                a.get("instance_type") or "-",
                a.get("availability_zone") or "-",
                a.get("lifecycle") or "-",
                _when(a.get("started_at")),
                _when(a.get("stopped_at")),
                a.get("outcome") or a.get("last_status", "-"),
            ]
            for a in job["attempts"]
        ]
        lines += ["", table(rows, ["#", "TASK", "TYPE", "ZONE", "MARKET", "STARTED", "STOPPED", "OUTCOME"])]
        cps = job.get("checkpoints") or []
        if cps:
            newest = cps[-1]
            lines.append(
                f"\n{len(cps)} checkpoint(s); newest #{newest['sequence']} at step {newest['step']} "
                f"({newest['progress']:.0%}) from attempt {newest['attempt']}"
            )
        if job.get("snapshots"):
            lines.append(
                f"EBS snapshots: {', '.join(job['snapshots'])} (the next attempt starts from the last)"
            )
        decisions = job.get("decisions") or []
        if decisions:
            rows = [
                [
                    _when(d.get("at")),
                    d.get("trigger", "-"),
                    d["placement"],
                    d.get("pool") or "-",
                    f"${d['expected_cost']:.2f}" if d.get("expected_cost") is not None else "-",
                    d.get("reason", ""),
                ]
                for d in decisions[-5:]
            ]
            lines += [
                f"\ncapacity decisions ({len(decisions)}, newest last; "
                f"moves made: {job.get('moves_made', 0)}):",
                table(rows, ["AT", "WHY ASKED", "PLACEMENT", "POOL", "TO FINISH", "REASON"]),
            ]
        if job.get("move"):
            to = job["move"]["to"]
            lines.append(f"moving to {to['placement']} {to.get('pool') or ''}: waiting for its checkpoint")
        spend = job.get("spend") or {}
        if spend:
            lines.append(spend_text(spend))
    return "\n".join(lines)


def spend_text(spend: dict[str, Any]) -> str:
    """What a job spent, in words: 'spent 2.32 GPU-hours (0.04 lost), $0.42 ($0.01 lost)'."""
    money = ""
    if spend.get("dollars") is not None:
        money = f", ${spend['dollars']:.2f} (${spend.get('dollars_lost') or 0:.2f} lost)"
    return f"spent {spend['gpu_hours']:.2f} GPU-hours ({spend.get('gpu_hours_lost') or 0:.2f} lost){money}"


def plot(path: str, answer: dict[str, Any], clock: Clock) -> bool:
    """`status --plot`: the job's timeline drawn to `path` (up to now while it runs); False, said in one
    line, when it could not be."""
    from spotguard_cli.timeline_plot import plot_job

    job = answer.get("job") or {}
    try:
        plot_job(answer, path, now=None if job.get("state") in TERMINAL_STATES else clock.now())
    except (OSError, ValueError) as exc:
        print(f"spotguard jobs status: --plot: {exc}".splitlines()[0], file=sys.stderr)
        return False
    print(f"timeline written to {path}", file=sys.stderr)
    return True

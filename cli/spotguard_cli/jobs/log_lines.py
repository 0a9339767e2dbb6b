"""The lines `spotguard jobs logs` says around an attempt's logs: its header, the line between two
attempts, and the job's end.

Between two attempts one line says why the first stopped (an interruption and its kind, a move, an
error, exit codes) and where the next resumed (its checkpoint's sequence and step).
"""

from __future__ import annotations

from datetime import datetime

from spotguard.domain.jobs.model import TERMINAL  # a job's states once it has ended
from spotguard_cli.answers import AttemptView, CheckpointView, StatusView
from spotguard_cli.jobs.log_streams import task_id


def _when(at: datetime | None) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S}" if at else "?"


def _duration(a: AttemptView) -> str:
    start, end = a.started_at, a.stopped_at
    if start is None or end is None:
        return ""
    return f" after {duration_text((end - start).total_seconds())}"


def duration_text(seconds: float) -> str:
    """'10s', '4m05s', '45m', '2h03m': seconds under ten minutes, minutes under hours."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    minutes = s // 60
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def why_stopped(a: AttemptView) -> str:
    """Why an attempt stopped, in a phrase: a move, an interruption (its kind), an error, a cancel."""
    reason = a.outcome_reason or ""
    outcome = a.outcome
    by = a.interrupted_by or ""
    if reason.startswith("moved: "):
        what = f"moved by SpotGuard ({reason.removeprefix('moved: ')})"
    elif by:
        parts = by.split("#")
        what = f"interrupted: {parts[0]}" + (f" on {parts[-1]}" if len(parts) == 3 else "")
        if reason and by not in reason and reason != parts[0]:
            what += f" ({reason})"
    elif outcome == "failed":
        what = f"failed: {reason}"
    elif outcome == "cancelled":
        what = "cancelled"
    elif outcome == "succeeded":
        what = "succeeded"
    elif outcome == "resubmit":
        what = f"stopped: {reason}"
    elif a.last_status == "STOPPED":
        what = f"stopped: {a.stopped_reason or a.stop_code or 'no reason given'}"
    else:
        what = f"still {a.last_status or 'running'}"
    codes = a.exit_codes
    extras = []
    if codes:
        extras.append("exit " + ", ".join(f"{k}={'-' if v is None else v}" for k, v in sorted(codes.items())))
    # ECS's stop code of a StopTask is UserInitiated, SpotGuard's too: said so, not as if a user stopped it
    spotguards = a.stop_code == "UserInitiated" and (a.stopped_reason or "").startswith("SpotGuard")
    if a.stop_code and a.stop_code not in what and not spotguards:
        extras.append(a.stop_code)
    return what + (f"; {'; '.join(extras)}" if extras else "")


def where(a: AttemptView) -> str:
    market = a.market or a.lifecycle
    bits = [b for b in (market, a.pool or a.instance_type, None if a.pool else a.availability_zone) if b]
    return f" on {' '.join(bits)}" if bits else ""


def resumed_from(a: AttemptView, before: AttemptView | None, checkpoints: list[CheckpointView]) -> str:
    uri = a.resume_from
    if uri:
        ref = next((c for c in checkpoints if c.manifest_uri == uri), None)
        if ref is None:
            return f"from {uri}"
        return f"from checkpoint #{ref.sequence} ({ref.step_label}, {ref.progress:.0%})"
    if before is not None and before.snapshot_id:
        return f"from EBS snapshot {before.snapshot_id}"
    return "from scratch (no checkpoint)"


def _tasks_text(a: AttemptView) -> str:
    """'task 0123456789ab', or for a multi-node attempt '2 nodes, node 0's task 0123456789ab' (node 0's
    task is the attempt's; the others are launched once it runs)."""
    task = f"task {task_id(a.task_arn)[:12]}"
    return f"{a.nodes} nodes, node 0's {task}" if a.gang else task


def header_line(a: AttemptView, checkpoints: list[CheckpointView]) -> str:
    return (
        f"--- attempt {a.number}: {_tasks_text(a)}{where(a)}, launched "
        f"{_when(a.launched_at)}, {resumed_from(a, None, checkpoints)}"
    )


def between_line(before: AttemptView, after: AttemptView, checkpoints: list[CheckpointView]) -> str:
    stopped = f" at {_when(before.stopped_at)}" if before.stopped_at else ""
    return (
        f"--- attempt {before.number} stopped{stopped}{_duration(before)}: {why_stopped(before)} -> "
        f"attempt {after.number} ({_tasks_text(after)}{where(after)}) resumed "
        f"{resumed_from(after, before, checkpoints)}"
    )


def end_line(job: StatusView) -> str:
    if job.state in TERMINAL:
        return f"--- job {job.job_id} {job.state}: {job.last_reason}".rstrip(": ")
    return f"--- job {job.job_id} is {job.state} ({job.last_reason or 'no reason recorded'})"

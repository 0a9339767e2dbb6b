"""Money and time: GPU-hours and dollars an attempt spent, and what was lost (run after the last commit)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel

from spotguard.domain.jobs.model import Attempt, Job


class Spend(BaseModel):
    gpu_hours: float = 0.0
    gpu_hours_lost: float = 0.0
    dollars: float | None = None
    dollars_lost: float | None = None


def spend(job: Job, checkpoint_times: Mapping[int, list[datetime]], now: datetime) -> Spend:
    """GPU-hours and money spent per attempt, and lost: the time an attempt ran after its last committed
    checkpoint (all of it, when it committed none) and that the next attempt had to do again. The folded
    oldest attempts (`Job.folded`) count what they spent; what they lost is no longer known."""
    total = Spend(gpu_hours=job.folded.gpu_hours, dollars=job.folded.dollars, dollars_lost=0.0)
    for a in job.attempts:
        total = _add(total, attempt_spend(a, job.gpus, checkpoint_times, now))
    return Spend(
        gpu_hours=round(total.gpu_hours, 4),
        gpu_hours_lost=round(total.gpu_hours_lost, 4),
        dollars=None if total.dollars is None else round(total.dollars, 4),
        dollars_lost=None
        if total.dollars is None or total.dollars_lost is None
        else round(total.dollars_lost, 4),
    )


def _add(a: Spend, b: Spend) -> Spend:
    priced = a.dollars is not None and b.dollars is not None
    return Spend(
        gpu_hours=a.gpu_hours + b.gpu_hours,
        gpu_hours_lost=a.gpu_hours_lost + b.gpu_hours_lost,
        dollars=(a.dollars or 0.0) + (b.dollars or 0.0) if priced else None,
        dollars_lost=(a.dollars_lost or 0.0) + (b.dollars_lost or 0.0) if priced else None,
    )


def attempt_spend(
    a: Attempt, gpus: int, checkpoint_times: Mapping[int, list[datetime]], now: datetime
) -> Spend:
    """One attempt's spend (every node's instance), unrounded; dollars None when a price is unknown."""
    total = lost = 0.0
    dollars = dollars_lost = 0.0
    priced = True
    for t in a.tasks:  # a multi-node job's attempt: every node's instance
        if t.started_at is None:
            continue
        # an old gang's folded nodes (domain.jobs.gangs.compact) ran over node 0's time
        count = 1 + (a.folded_peers if t is a else 0)
        end = t.stopped_at or now
        hours = max(0.0, (end - t.started_at).total_seconds() / 3600)
        wasted = 0.0
        if a.outcome in ("resubmit", "failed", "cancelled"):
            commits = [c for c in checkpoint_times.get(a.number, []) if t.started_at <= c <= end]
            since = max(commits) if commits else t.started_at
            wasted = max(0.0, (end - since).total_seconds() / 3600)
        total += hours * max(gpus, 1) * count
        lost += wasted * max(gpus, 1) * count
        price = t.price_per_hour
        if t is a and a.folded_peers:
            folded = a.folded_price_per_hour
            price = None if price is None or folded is None else price + folded
        if price is None:
            priced = False
        else:
            dollars += hours * price
            dollars_lost += wasted * price
    return Spend(
        gpu_hours=total,
        gpu_hours_lost=lost,
        dollars=dollars if priced else None,
        dollars_lost=dollars_lost if priced else None,
    )

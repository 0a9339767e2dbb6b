"""Where a job runs: the capacity decisions SpotGuard makes for it, what the policy is told about the job,
and the RunTask placement a decision turns into. Pure, but for the time a policy's answer is stamped
with when none is given (`PlacementDecision.at`; the capacity advisor gives its clock's).

Every launch of a job whose cluster has pools (`spotguard.domain.pools`) asks the capacity policy
(`spotguard.domain.capacity.planner.choose_capacity`) where to run: spot in a pool, on-demand, or wait. Its
answer is a `PlacementDecision` with the policy's fields; the capacity advisor
(`spotguard.usecases.jobs.advisor`) completes it (when, why asked, the pool's capacity provider, type
and zone, the figures below) into the decision the job records. What the policy is told about the job
(`job_needs`), from the job and its committed checkpoints:

- work left: `1 - progress` of the newest checkpoint, at the job's measured rate of progress;
- the rate: progress per hour between consecutive checkpoints of the same attempt, over all attempts
  (restarts and waits do not count); before two checkpoints exist, `options.work_hours` (the user's
  estimate of the whole job); without either, `DEFAULT_WORK_HOURS`, or with a deadline
  `UNKNOWN_WORK_SHARE` of the time from submit to the deadline;
- the restart overhead: per attempt, RunTask to its first committed checkpoint, less the progress that
  checkpoint made over the one it resumed from (at the measured rate): the time a restart costs, boot,
  image pull and restore included. The median over attempts; `DEFAULT_RESTART_HOURS` until one is
  measured;
- the deadline, and what the job holds now (for the decisions taken while it runs).

A decision is recorded on the job (`Job.decisions`, the newest `MAX_DECISIONS`) and sent on the bus;
the launch that follows carries it out (`placement_params`): the pool's capacity provider as the task's
capacity provider strategy, narrowed to the pool's instance type and zone by a `memberOf` constraint
where the provider spans several.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import JobNeeds
from spotguard.domain.checkpoints import CheckpointRef

DEFAULT_RESTART_HOURS = 0.2  # until measured: a GPU instance boots, pulls and restores in ~10-15 min
DEFAULT_WORK_HOURS = 4.0  # no estimate, no measurement, no deadline: only the no-deadline rules use it
UNKNOWN_WORK_SHARE = 0.5  # with a deadline and no estimate: the work fills half the time to it
MIN_RATE_SPAN_HOURS = 1 / 60  # checkpoints closer than this in total do not measure a rate
MAX_DECISIONS = 20


class Move(BaseModel):
    """A running job SpotGuard is moving to other capacity: asked to checkpoint (SIGUSR1) at
    `requested_at`, stopped once a checkpoint newer than that is committed, relaunched as `to` says."""

    model_config = ConfigDict(frozen=True)
    attempt: int
    to: PlacementDecision
    requested_at: datetime
    stop_requested_at: datetime | None = None


def progress_rate(refs: Sequence[CheckpointRef]) -> float | None:
    """Progress per hour of running, from consecutive checkpoints of the same attempt (None: not yet
    measurable)."""
    by_attempt: dict[int, list[CheckpointRef]] = {}
    for r in refs:
        if r.created_at is not None:
            by_attempt.setdefault(r.attempt, []).append(r)
    made = hours = 0.0
    for commits in by_attempt.values():
        commits.sort(key=lambda r: (r.created_at, r.sequence))
        for a, b in itertools.pairwise(commits):
            assert a.created_at is not None and b.created_at is not None
            span = (b.created_at - a.created_at).total_seconds() / 3600
            if span > 0 and b.progress >= a.progress:
                made += b.progress - a.progress
                hours += span
    if hours < MIN_RATE_SPAN_HOURS or made <= 0:
        return None
    return made / hours


def restart_overheads(
    launches: Sequence[tuple[int, datetime]], refs: Sequence[CheckpointRef], rate: float
) -> list[float]:
    """Per attempt (`launches`: number and RunTask time), hours from RunTask to its first committed
    checkpoint less the time the progress it made since the checkpoint it resumed from accounts for."""
    out: list[float] = []
    dated = sorted((r for r in refs if r.created_at is not None), key=lambda r: (r.created_at, r.sequence))
    for number, launched in launches:
        first = next((r for r in dated if r.attempt == number), None)
        if first is None or first.created_at is None or first.created_at < launched:
            continue
        before = [r for r in dated if r.created_at is not None and r.created_at <= launched]
        resumed = before[-1].progress if before else 0.0
        elapsed = (first.created_at - launched).total_seconds() / 3600
        working = max(0.0, first.progress - resumed) / rate if rate > 0 else 0.0
        out.append(max(0.0, elapsed - working))
    return out


def job_needs(
    gpus: int,
    refs: Sequence[CheckpointRef],
    launches: Sequence[tuple[int, datetime]],
    work_hours: float | None,
    submitted_at: datetime,
    deadline: datetime | None,
    now: datetime,
) -> JobNeeds:
    """What the policy is told about the job now (the module's docstring says where each figure comes
    from); what it holds now is the capacity advisor's to add."""
    newest = max(refs, key=lambda r: r.sequence, default=None)
    progress = min(1.0, max(0.0, newest.progress)) if newest is not None else 0.0
    time_left = (deadline - now).total_seconds() / 3600 if deadline is not None else None
    measured = progress_rate(refs)
    if measured is not None:
        rate = measured
    elif work_hours:
        rate = 1.0 / work_hours
    elif deadline is not None:
        rate = 1.0 / max(UNKNOWN_WORK_SHARE * (deadline - submitted_at).total_seconds() / 3600, 1 / 60)
    else:
        rate = 1.0 / DEFAULT_WORK_HOURS
    overheads = restart_overheads(launches, refs, rate)
    return JobNeeds(
        gpus=gpus,
        work_left_hours=max((1.0 - progress) / rate, 1 / 60),
        restart_hours=statistics.median(overheads) if overheads else DEFAULT_RESTART_HOURS,
        time_left_hours=time_left,
        progress=progress,
        rate_per_hour=rate,
        rate_measured=measured is not None,
        work_assumed=measured is None and not work_hours and deadline is not None,
        restart_measured=bool(overheads),
    )


def placement_params(params: dict[str, Any], decision: PlacementDecision | None) -> dict[str, Any]:
    """RunTask parameters placed as the decision says: the pool's capacity provider as the strategy
    (instead of the request's launch type or strategy), and a constraint to the pool's instance type and
    zone where its provider spans several. The constraint goes first, before any the request or the
    avoidance add, so that ECS's limit of 10 never drops it."""
    if decision is None or decision.placement == "none" or not decision.capacity_provider:
        return params
    out = dict(params)
    out.pop("launchType", None)
    provider = {"capacityProvider": decision.capacity_provider, "weight": 1, "base": 0}
    out["capacityProviderStrategy"] = [provider]
    terms = []
    if decision.constrain_type and decision.instance_type:
        terms.append(f"attribute:ecs.instance-type == {decision.instance_type}")
    if decision.constrain_zone and decision.availability_zone:
        terms.append(f"attribute:ecs.availability-zone == {decision.availability_zone}")
    if terms:
        pinned = {"type": "memberOf", "expression": " and ".join(terms)}
        out["placementConstraints"] = [pinned, *(out.get("placementConstraints") or [])][:10]
    return out


def remember(decisions: Sequence[PlacementDecision], decision: PlacementDecision) -> list[PlacementDecision]:
    """The job's decisions with this one, the newest `MAX_DECISIONS`."""
    return [*decisions, decision][-MAX_DECISIONS:]

"""Where a job runs: the capacity decisions SpotGuard makes for it, what the policy is told about the job,
and the RunTask placement a decision turns into. Pure, but for the time a policy's answer is stamped
with when none is given (`PlacementDecision.at`; the capacity advisor gives its clock's).

Every launch of a job whose cluster has pools (`spotguard.domain.pools`) asks the capacity policy
(`spotguard.domain.planner.choose_capacity`) where to run: spot in a pool, on-demand, or wait. Its
answer is a `PlacementDecision` with the policy's fields; the capacity advisor
(`spotguard.usecases.jobs.capacity`) completes it (when, why asked, the pool's capacity provider, type
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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spotguard import clock
from spotguard.domain.capacity import JobNeeds, Market
from spotguard.domain.checkpoints import CheckpointRef

DEFAULT_RESTART_HOURS = 0.2  # until measured: a GPU instance boots, pulls and restores in ~10-15 min
DEFAULT_WORK_HOURS = 4.0  # no estimate, no measurement, no deadline: only the no-deadline rules use it
UNKNOWN_WORK_SHARE = 0.5  # with a deadline and no estimate: the work fills half the time to it
MIN_RATE_SPAN_HOURS = 1 / 60  # checkpoints closer than this in total do not measure a rate
MAX_DECISIONS = 20


class PlacementDecision(BaseModel):
    """One capacity decision: where the job is to run (`placement`: spot, on-demand, or none: it waits),
    why, and what the plan expects it to cost to finish. `pool` is the pool's name (capacity
    provider/instance type/zone): the spot pool on spot; on-demand, the on-demand pool the advisor chose
    (None in the policy's answer, whose `instance_pool` names the spot pool whose instance type and zone to
    run on-demand in). `placement` is a `Market`, a StrEnum: stored and sent as "spot", "on-demand",
    "none".

    The policy's answer (`choose_capacity`) sets the policy's fields (placement, pool, instance_pool,
    reason, expected_cost, recheck_seconds, servable) and leaves `at` at the time it was made; the
    capacity advisor completes it with `model_copy(update=...)`. `expected_cost`: the plan's expected $ to
    finish from here (the time value of the hours until then included), None when no plan was run (no
    deadline, or the deadline alone decided). `recheck_seconds`: when to ask again, 60..900 s in the
    policy's answer: waiting, a tick (the plan decides tick by tick, and spot may be back by then) or what
    is left of the bounded wait without a deadline; on on-demand, a tick (spot may be back and worth the
    move), or the longest when the deadline keeps the job on on-demand to the end; on spot, the longest
    (an interruption reaches SpotGuard as an event without asking; asking again only weighs a move).
    `servable`: False when no pool has the job's GPUs per instance (then placement NONE)."""

    model_config = ConfigDict(frozen=True)
    at: datetime = Field(default_factory=clock.now)
    # "warning": made at a spot warning (or terminate action) for the attempt after the warned one, whose
    # launch carries it out (domain.jobs.spares); "move": a move's, carried out by the launch after it
    trigger: Literal["launch", "reconcile", "pool-event", "move", "warning"] = "launch"
    placement: Market
    pool: str | None = None
    instance_pool: str | None = None  # the pool whose instance type to use (for on-demand too)
    capacity_provider: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None
    constrain_type: bool = False  # the provider spans several instance types: pin this one
    constrain_zone: bool = False  # ... several zones: pin this one
    reason: str = Field(max_length=500)
    expected_cost: float | None = None  # $ to finish, by the plan (None: no plan was run)
    work_left_hours: float | None = None
    time_left_hours: float | None = None
    restart_hours: float | None = None
    servable: bool = True  # False: no pool of the cluster can run the job at all
    recheck_seconds: int = Field(default=0, ge=0, le=900)

    def same_place(self, other: PlacementDecision | None) -> bool:
        return other is not None and (self.placement, self.pool) == (other.placement, other.pool)

    def summary(self) -> str:
        where = {
            Market.SPOT: f"spot in {self.pool}",
            Market.ON_DEMAND: f"on-demand in {self.pool}",
            Market.NONE: "wait",
        }
        cost = f"; expected ${self.expected_cost:,.2f} to finish" if self.expected_cost is not None else ""
        said = where[self.placement]
        if self.reason.startswith(said):  # the policy's reason may already say where
            return f"{self.reason}{cost}"
        return f"{said}: {self.reason}{cost}"


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

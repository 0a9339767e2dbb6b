"""The capacity policy's decision: where a job is to run, why, and what the plan expects it to cost. The
policy (`planner.choose_capacity`) answers one with its own fields; the capacity advisor
(`spotguard.usecases.jobs.advisor`) completes it; the job records it (`spotguard.domain.jobs`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spotguard.domain import clock
from spotguard.domain.capacity.model import Market


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

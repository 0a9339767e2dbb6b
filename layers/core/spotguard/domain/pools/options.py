"""Which pools: the pool an instance is in, the pools an Auto Scaling event names, and the planner's
candidates (`pool_options`: each spot pool's prices, availability and tick-based history, which
`availability_history` rebuilds from the pool's facts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from spotguard.domain.pools.records import HOLD_HOURS, Frozen, PoolRecord
from spotguard.domain.prices import UNPRICED_PER_GPU

if TYPE_CHECKING:  # the planner needs numpy: loaded only where options are built
    from spotguard.domain.capacity.planner import AvailabilityHistory, PoolOption


class HostPlacement(Frozen):
    """Where an instance of a cluster is, as ECS describes its container instance: the capacity provider
    ECS associates it with (`capacityProviderName`; None when ECS names none), and its
    `ecs.instance-type` and `ecs.availability-zone` attributes (None when missing)."""

    cluster: str  # the cluster's name
    capacity_provider: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None


def host_pools(pools: Iterable[PoolRecord], host: HostPlacement) -> list[PoolRecord]:
    """The pool an instance is in: the one of its capacity provider, type and zone. When ECS names no
    provider, the spot pool of its type and zone, if only one provider has such a pool (a rebalance
    recommendation is for spot instances; two providers with the same type in a zone cannot be told
    apart, and a fact on the wrong pool would be worse than none). An empty list: no pool of the
    cluster's is known to hold it."""
    if host.instance_type is None or host.availability_zone is None:
        return []
    here = [
        p
        for p in pools
        if (p.instance_type, p.availability_zone) == (host.instance_type, host.availability_zone)
        and p.cluster == host.cluster
    ]
    if host.capacity_provider is not None:
        return [p for p in here if p.capacity_provider == host.capacity_provider]
    spot = [p for p in here if p.market == "spot"]
    return spot if len({p.capacity_provider for p in spot}) == 1 else []


def matching_pools(
    pools: Iterable[PoolRecord],
    auto_scaling_group: str,
    availability_zone: str | None = None,
    instance_type: str | None = None,
) -> list[PoolRecord]:
    """The pools of a group, narrowed to a zone and a type when known (an Auto Scaling launch failure
    names the group and the zone, not always the type)."""
    return [
        p
        for p in pools
        if p.auto_scaling_group == auto_scaling_group
        and availability_zone in (None, p.availability_zone)
        and instance_type in (None, p.instance_type)
    ]


# ====================================================================================== the policy
def availability_history(
    pool: PoolRecord,
    tick_hours: float,
    now: datetime,
    half_life_hours: float = 168.0,
    hold_hours: float = HOLD_HOURS,
) -> AvailabilityHistory:
    """The pool's history facts (`PoolRecord.history_facts`: risk signals and refused providers aside)
    as the planner's tick-based history, up to the tick of `now`.

    Ticks are `tick_hours` long, counted from the epoch. The rule: a fact holds from its own tick until
    the next fact, for at most `hold_hours`; within a tick the last fact counts. A tick no fact holds is
    unknown: at the first unknown tick after known ones the history is told `gap()` (the run's age is no
    longer known), and the unknown stretch still ages the counts (so a week-old outage weighs what a week
    of decay leaves of it). A pool whose newest fact is older than `hold_hours` thus ends in a gap."""
    from spotguard.domain.capacity.planner import AvailabilityHistory

    history = AvailabilityHistory(tick_hours, half_life_hours)
    facts = [o for o in pool.history_facts if o.at <= now]
    if not facts:
        return history
    tick = tick_hours * 3600.0
    hold = max(1, math.ceil(hold_hours * 3600.0 / tick - 1e-9))  # ticks a fact holds, its own included

    def index(at: datetime) -> int:
        return math.floor(at.timestamp() / tick)

    last_tick = index(now)
    # The state of each tick that has facts: the last fact in it.
    by_tick: dict[int, bool] = {}
    for o in facts:
        by_tick[index(o.at)] = o.available
    ticks = sorted(by_tick)
    position = ticks[0]
    for i, start in enumerate(ticks):
        if start > position:  # unknown ticks between the previous fact's hold and this one
            history.gap()
            _elapse(history, start - position)
        end = min(start + hold, ticks[i + 1] if i + 1 < len(ticks) else last_tick + 1, last_tick + 1)
        for _ in range(start, end):
            history.observe(by_tick[start])
        position = end
    if position <= last_tick:  # the newest fact no longer holds: the state now is not known
        history.gap()
        _elapse(history, last_tick + 1 - position)
    return history


def _elapse(history: AvailabilityHistory, ticks: int) -> None:
    """Age the history's counts over ticks nobody observed, as `observe` ages them each tick."""
    factor = history.decay**ticks
    history.exposure *= factor
    history.ends *= factor


def on_demand_price_or_penalty(pool: PoolRecord) -> float:
    """The pool's on-demand price, or for an unpriced pool the penalty price (see UNPRICED_PER_GPU)."""
    if pool.on_demand_price is not None:
        return pool.on_demand_price
    return UNPRICED_PER_GPU * max(pool.gpus_per_instance, 1)


def pool_options(
    pools: Iterable[PoolRecord],
    now: datetime,
    tick_hours: float,
    half_life_hours: float = 168.0,
    hold_hours: float = HOLD_HOURS,
) -> list[PoolOption]:
    """The planner's candidates: every spot pool still in the cluster, by name. A pool is available when
    it is not backed off (`unavailable_until` past) and its spot price is known; an unavailable one is
    still a candidate (its history and on-demand price count). On-demand pools are not candidates: the
    planner's on-demand choice is a spot pool's instance type (`PlacementDecision.instance_pool`), placed
    with `on_demand_pool`. A pool without history facts (`PoolRecord.history_facts`) has no history (the
    planner's prior and the placement score stand in)."""
    from spotguard.domain.capacity.planner import PoolOption

    options = []
    for p in sorted(pools, key=lambda p: p.name):
        if p.market != "spot" or p.gone_since is not None:
            continue
        on_demand = on_demand_price_or_penalty(p)
        options.append(
            PoolOption(
                name=p.name,
                gpus_per_instance=p.gpus_per_instance,
                spot_price=p.spot_price if p.spot_price is not None else on_demand,
                on_demand_price=on_demand,
                available=p.available_at(now) and p.spot_price is not None,
                history=availability_history(p, tick_hours, now, half_life_hours, hold_hours)
                if p.history_facts
                else None,
                placement_score=p.placement_score,
            )
        )
    return options


def on_demand_pool(
    pools: Iterable[PoolRecord], instance_type: str, now: datetime, zone: str | None = None
) -> PoolRecord | None:
    """Where to run on-demand in a type: an on-demand pool of that type not backed off, in `zone` if one
    is there, else the first by name (None: the cluster has no on-demand pool of that type)."""
    fits = sorted(
        (
            p
            for p in pools
            if p.market == "on-demand" and p.instance_type == instance_type and p.available_at(now)
        ),
        key=lambda p: (p.availability_zone != zone, p.name),
    )
    return fits[0] if fits else None


def by_name(pools: Iterable[PoolRecord]) -> Mapping[str, PoolRecord]:
    return {p.name: p for p in pools}

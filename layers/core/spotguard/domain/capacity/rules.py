"""The rules both of SpotGuard's capacity policies follow: the plan's grid and its making (`Grid`,
`build_plan`), the two pools a joint plan covers (`pick_two`), the wait beside spot (`beside_spot`), and
what spot costs per hour of work.

The Lambdas' `choose_capacity` (spotguard.domain.capacity.planner) and the simulator's `SpotGuardPolicy`
(spotguard.domain.capacity.simulated) both take them from here, so that they cannot drift between them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spotguard.domain.capacity.availability import AvailabilityHistory, coarse_hazards
from spotguard.domain.capacity.plans import JointPlan, Plan, plan_grid

TIME_VALUE_SHARE = 0.05  # the default time value: this share of the on-demand price, per hour unfinished
# A plan may wait beside spot only for a pool more than this share cheaper per hour of work (`beside_spot`)
WAIT_MARGIN = 0.25


def default_time_value(on_demand_price: float) -> float:
    return TIME_VALUE_SHARE * on_demand_price


@dataclass(frozen=True, slots=True)
class Grid:
    """A plan's time grid for one decision: `k` units per tick (the restart overhead is `d` units of
    `unit_hours`), the ticks left to the deadline, and the slack (time left beyond the work) in units."""

    k: int
    d: int
    unit_hours: float
    ticks: int
    slack: int

    @classmethod
    def of(
        cls, time_left_hours: float, work_left_hours: float, tick_hours: float, restart_hours: float
    ) -> Grid:
        k, d = plan_grid(tick_hours, restart_hours)
        unit = tick_hours / k
        ticks = max(1, round(time_left_hours / tick_hours))
        slack = max(0, math.floor((time_left_hours - work_left_hours) / unit + 1e-6))
        return cls(k, d, unit, ticks, slack)


def build_plan(
    histories: Sequence[AvailabilityHistory],
    grid: Grid,
    spot_prices: Sequence[float],
    on_demand_price: float,
    tick_hours: float,
    time_value_per_hour: float,
    keep_ticks: int | None,
) -> Plan | JointPlan:
    """The plan over one pool (`Plan`) or two (`JointPlan`), the one way both the Lambdas'
    `choose_capacity` and the simulator's `SpotGuardPolicy` make them. `keep_ticks`: how many ticks'
    actions to keep (a simulated run looks them up as it goes; a single decision needs the first); None:
    every fine tick's."""
    if len(histories) == 1:
        return Plan(
            histories[0].hazards(),
            grid.ticks,
            grid.slack,
            grid.k,
            grid.d,
            spot_prices[0],
            on_demand_price,
            tick_hours,
            keep_all=keep_ticks is None or keep_ticks > 1,
            time_value_per_hour=time_value_per_hour,
        )
    return JointPlan(
        [coarse_hazards(h) for h in histories],
        grid.ticks,
        grid.slack,
        grid.k,
        grid.d,
        spot_prices,
        on_demand_price,
        tick_hours,
        keep_ticks=keep_ticks if keep_ticks is not None else grid.ticks,
        time_value_per_hour=time_value_per_hour,
    )


def pick_two(costs: Sequence[float], available: Sequence[bool], held: int | None) -> list[int]:
    """The two pools (indices) a joint plan covers: the one the job holds, else the cheapest that has spot
    now, else the cheapest; then the cheapest of the rest. `costs`: spot $ per hour of work, by pool."""
    if len(costs) < 2 or len(available) != len(costs):
        raise ValueError("a joint plan needs two pools or more, each with its availability")
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    first = held if held is not None else next((i for i in order if available[i]), order[0])
    return [first, next(i for i in order if i != first)]


@dataclass(frozen=True, slots=True)
class BesideSpot:
    """What becomes of a plan's wait while some pool has spot (`beside_spot`): `run` the pool to run in
    instead, or None when the wait stands; `reason` says why, with the figures."""

    run: int | None
    reason: str


def beside_spot(
    names: Sequence[str],
    costs: Sequence[float],
    available: Sequence[bool],
    pays: Sequence[bool],
    run_hours: Sequence[float],
    back_hours: Sequence[float],
    held: int | None = None,
) -> BesideSpot | None:
    """The rule for a plan's wait, when the job holds nothing or spot (`held`: the pool it holds), while
    a pool it may use has spot now (None when none has). A job is never left idle beside spot for a
    small saving: the wait stands only for a pool more than `WAIT_MARGIN` cheaper per hour of work
    (`costs`) than the best pool with spot (the one it holds, if that pays), or when no pool with spot
    pays back a restart by its own history (`pays`: False only where the pool's record says its spot
    runs are too short, `run_hours` from now). Otherwise the job runs in that best pool. The plan still
    decides when waiting for a much cheaper pool is worth it (`back_hours`: when each pool without spot
    is expected to have it again), and its wait is said with the figures. A pool whose cost is not a
    number is left out. Not for a job on on-demand: it is not idle, and a plan's wait there keeps it
    where it is.

    Why a rule and not the plan alone: the plan prices an idle hour at the time value (5% of on-demand),
    so for a long job a saving of a few percent outweighs hours of waiting, which nobody who submits a
    job wants. Below the margin, price differences between spot pools are within what their prices move
    in a day."""
    priced = [i for i, c in enumerate(costs) if math.isfinite(c)]
    with_spot = [i for i in priced if available[i]]
    if not with_spot:
        return None
    paying = [i for i in with_spot if pays[i]]
    if not paying:
        i = min(with_spot, key=lambda j: (costs[j], j))
        return BesideSpot(
            None,
            f"wait: spot in {names[i]} is expected to last about {run_hours[i]:.1f} h by its record, too "
            "short to pay back a restart",
        )
    best = held if held in paying else min(paying, key=lambda j: (costs[j], j))
    cheaper = [i for i in priced if not available[i] and costs[i] < (1 - WAIT_MARGIN) * costs[best]]
    if cheaper:
        c = min(cheaper, key=lambda j: (costs[j], j))
        share = 1 - costs[c] / costs[best]
        return BesideSpot(
            None,
            f"wait for spot in {names[c]}: ${costs[c]:.3f} per hour of work, {share:.0%} cheaper than "
            f"{names[best]} (${costs[best]:.3f}), which has spot now; expected back in about "
            f"{back_hours[c]:.1f} h",
        )
    return BesideSpot(
        best,
        f"spot in {names[best]} (${costs[best]:.3f} per hour of work): no pool is more than "
        f"{WAIT_MARGIN:.0%} cheaper, so no wait beside spot",
    )


def spot_pays(spot_price: float, on_demand_price: float, run_hours: float, restart_hours: float) -> bool:
    """Whether a spot run of `run_hours` pays back its restart: the run at spot (restart included) costs
    less than the progress it makes (the run less the restart) would on-demand."""
    return spot_price * run_hours < on_demand_price * (run_hours - restart_hours)


def expected_run_hours(
    history: AvailabilityHistory | None, tick_hours: float, placement_score: int | None = None
) -> float:
    """How long spot in a pool is expected to last from now: from its history, else from the prior,
    scaled by the placement score (5 is neutral) when there is one."""
    hours = (history or AvailabilityHistory(tick_hours)).expected_spot_ticks() * tick_hours
    if history is None and placement_score is not None:
        hours *= max(1, min(placement_score, 10)) / 5
    return hours


def spot_cost_per_work_hour(
    spot_price: float,
    history: AvailabilityHistory | None,
    restart_hours: float,
    tick_hours: float,
    placement_score: int | None = None,
) -> float:
    """The spot price per hour of progress: each run pays its restart overhead before it makes any."""
    run = expected_run_hours(history, tick_hours, placement_score)
    return spot_price * (run + restart_hours) / max(run, tick_hours)

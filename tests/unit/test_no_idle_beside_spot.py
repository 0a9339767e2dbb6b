"""No idle beside free spot (issue 31, item 1): a pool that fits and has spot now is never passed over for a
wait, unless a pool more than `WAIT_MARGIN` cheaper per hour of work is expected back, or the pool's own
record says its spot does not pay back a restart; the reason then says so with the figures. Seeded
properties over `choose_capacity` and over the simulator's policy (the same rule), and the cause found
underneath: the far grid's slack stopped short of the job's, so the plan's value was flat at the job's
own slack and waiting there looked free."""

from __future__ import annotations

import random

import pytest

from spotguard.domain.capacity.availability import AvailabilityHistory, coarse_hazards
from spotguard.domain.capacity.model import JobNeeds, Market, Situation
from spotguard.domain.capacity.planner import PoolOption, choose_capacity
from spotguard.domain.capacity.plans import JointPlan, split_horizon
from spotguard.domain.capacity.rules import (
    WAIT_MARGIN,
    Grid,
    beside_spot,
    default_time_value,
    spot_cost_per_work_hour,
)
from spotguard.domain.capacity.simulated import SpotGuardPolicy
from spotguard_cli.simulator import Job, Prices, Trace, simulate

TICK = 1 / 6


def _two_fresh_pools() -> list[PoolOption]:
    return [
        PoolOption("gpu-spot-a/g5.xlarge/us-east-1a", 1, 0.402, 1.006, True, None, 8),
        PoolOption("gpu-spot-b/g5.xlarge/us-east-1b", 1, 0.441, 1.006, True, None, 7),
    ]


@pytest.mark.parametrize("hours_left", [20, 100, 130, 140, 170, 200, 300])
def test_the_issues_job_runs_at_once_in_the_cheaper_pool(hours_left: float) -> None:
    # Two g5.xlarge pools with idle instances, a 1-GPU job of 10 h: it waited at 100-220 h left before
    d = choose_capacity(JobNeeds(1, 10.0, 0.2, hours_left), _two_fresh_pools())
    assert d.placement is Market.SPOT and d.pool == "gpu-spot-a/g5.xlarge/us-east-1a", d.reason


def test_the_far_grid_reaches_the_jobs_slack() -> None:
    """The cause, at its depth: the far grid's slack was rounded down to whole far units, so the fine
    grid's terminal value was flat over the top of the job's slack (up to a far unit, 0.86 h at 100 h
    left), and the plan waited until its slack fell below the flat part."""
    grid = Grid.of(100.0, 10.0, TICK, 0.2)
    hz = [coarse_hazards(AvailabilityHistory(TICK)) for _ in range(2)]
    h = split_horizon(grid.ticks, grid.slack, grid.k, grid.d, TICK, per_cell=7 * 12 * 12)
    assert h.step > 1  # the far grid is used here
    top_hours = (grid.slack - h.fine_ticks * grid.k) * grid.unit_hours
    assert h.far_slack * (h.step * TICK / h.far_k) >= top_hours - 1e-9
    plan = JointPlan(
        hz, grid.ticks, grid.slack, grid.k, grid.d, (0.402, 0.441), 1.006, TICK, 1,
        time_value_per_hour=default_time_value(1.006),
    )  # fmt: skip
    fresh = 2 * 6 // 2  # available, coarse bin 0: index NC + 0
    assert plan.choose(grid.ticks, 0, [fresh, fresh], grid.slack) == 2  # spot in the cheaper pool, now


def _random_case(rng: random.Random) -> tuple[JobNeeds, list[PoolOption]]:
    n = rng.randint(1, 4)
    pools = [
        PoolOption(
            f"p{j}",
            rng.choice([1, 1, 4]),
            round(rng.uniform(0.3, 0.6), 3),
            1.006,
            rng.random() < 0.6,
            None,
            rng.choice([None, 3, 5, 7, 9]),
        )
        for j in range(n)
    ]
    work = round(rng.uniform(0.5, 100), 2)
    return JobNeeds(1, work, 0.2, work * rng.uniform(1.2, 20)), pools


@pytest.mark.parametrize("seed", range(12))
def test_fresh_pools_with_spot_are_never_passed_over_for_a_small_saving(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2):
        job, pools = _random_case(rng)
        d = choose_capacity(job, pools)
        if d.placement is not Market.NONE or not any(p.available for p in pools):
            continue
        cost = {
            p.name: spot_cost_per_work_hour(p.spot_price, None, 0.2, TICK, p.placement_score) for p in pools
        }
        best = min(cost[p.name] for p in pools if p.available)
        awaited = [p.name for p in pools if not p.available and cost[p.name] < (1 - WAIT_MARGIN) * best]
        assert awaited, f"waited beside spot with no pool over {WAIT_MARGIN:.0%} cheaper: {d.reason}"
        assert d.reason.startswith("wait for spot in ") and "cheaper than" in d.reason and "$" in d.reason
        assert d.reason.split()[4].rstrip(":") in awaited


def test_the_rule_says_its_figures() -> None:
    names, costs = ["a", "b", "c"], [0.25, 0.45, 0.47]
    waiting = beside_spot(names, costs, [False, True, True], [True] * 3, [2.0] * 3, [1.5, 1.0, 1.0])
    assert waiting is not None and waiting.run is None
    assert waiting.reason == (
        "wait for spot in a: $0.250 per hour of work, 44% cheaper than b ($0.450), which has spot now; "
        "expected back in about 1.5 h"
    )
    running = beside_spot(names, [0.40, 0.45, 0.47], [False, True, True], [True] * 3, [2.0] * 3, [1.0] * 3)
    assert running is not None and running.run == 1 and "no pool is more than 25% cheaper" in running.reason
    short = beside_spot(["x"], [2.0], [True], [False], [0.3], [1.0])
    assert short is not None and short.run is None
    assert (
        short.reason
        == "wait: spot in x is expected to last about 0.3 h by its record, too short to pay back a restart"
    )
    assert beside_spot(names, costs, [False] * 3, [True] * 3, [1.0] * 3, [1.0] * 3) is None


def test_a_pool_whose_record_says_its_spot_does_not_pay_may_be_passed_over() -> None:
    # runs of one tick, outages of three, for days: spot there does not pay back a 0.2 h restart
    choppy = AvailabilityHistory(TICK)
    choppy.observe_all(([True] + [False] * 3) * 300 + [True])
    pool = PoolOption("choppy", 1, 0.40, 1.006, True, choppy, None)
    d = choose_capacity(JobNeeds(1, 5.0, 0.2, 60.0), [pool])
    assert d.placement is not Market.SPOT  # waits or goes on-demand: never the choppy pool's spot
    if d.placement is Market.NONE:
        assert "too short to pay back a restart" in d.reason


class _Watched(SpotGuardPolicy):
    """The simulator's policy, its every wait beside spot kept with its reason."""

    def __init__(self) -> None:
        super().__init__(1.0, 3.0)
        self.waits_beside_spot: list[str] = []

    def decide(self, s: Situation):  # type: ignore[no-untyped-def]
        choice = super().decide(s)
        if choice.placement is Market.NONE and any(s.spot_available):
            self.waits_beside_spot.append(choice.reason)
        return choice


@pytest.mark.parametrize("seed", range(4))
def test_the_simulated_policy_never_idles_beside_spot_that_pays(seed: int) -> None:
    rng = random.Random(seed)
    bits = [[rng.random() < 0.8 for _ in range(6)] for _ in range(2)]  # hour-long stretches, mostly spot
    traces = [Trace(f"t{i}", TICK, tuple(b for b in row for _ in range(6)) * 6) for i, row in enumerate(bits)]
    policy = _Watched()
    simulate(policy, traces, 0, Job(3.0, rng.uniform(5.0, 30.0), 0.2), Prices(spot=1.0, on_demand=3.0))
    # the pools share one price, but their records differ: a wait beside spot is for a pool more than the
    # margin cheaper per hour of work by its record, or because spot with it does not pay back a restart
    for reason in policy.waits_beside_spot:
        assert "too short to pay back a restart" in reason or (
            reason.startswith("wait for spot in pool ") and "cheaper than pool " in reason
        ), reason


def test_unknown_work_is_said_and_never_makes_the_job_idle_beside_spot() -> None:
    """Issue 31, item 3: no estimate and no progress yet: planned as half the time to the deadline, said
    in the reason; with spot free the job runs, whatever the deadline."""
    from datetime import UTC, datetime, timedelta

    from spotguard.domain.jobs.placement import job_needs

    t0 = datetime(2027, 1, 1, tzinfo=UTC)
    for hours in (10.0, 100.0, 400.0):
        needs = job_needs(1, [], [], None, t0, t0 + timedelta(hours=hours), t0)
        d = choose_capacity(needs, _two_fresh_pools())
        assert d.placement is Market.SPOT, d.reason
        said = f"its work is not known yet (no --work-hours, no rate measured): {hours / 2:.1f} h left"
        assert said in d.reason and len(d.reason) <= 500
    known = choose_capacity(JobNeeds(1, 10.0, 0.2, 100.0), _two_fresh_pools())
    assert "not known" not in known.reason


def test_a_job_not_idle_is_left_where_it_is() -> None:
    """The rule is for a job that would stand idle: on on-demand, a plan's wait keeps it there (no move
    to spot for it); on spot, it keeps the pool it holds rather than restart in one a little cheaper."""
    pools = _two_fresh_pools()
    for hours in (20.0, 100.0, 200.0):
        od = choose_capacity(JobNeeds(1, 10.0, 0.2, hours, placement=Market.ON_DEMAND), pools)
        assert "no wait beside spot" not in od.reason
        held = JobNeeds(1, 10.0, 0.2, hours, placement=Market.SPOT, pool=pools[1].name)
        assert choose_capacity(held, pools).pool == pools[1].name
    assert (
        beside_spot(["a", "b"], [0.40, 0.44], [True, True], [True, True], [2.0, 2.0], [1.0, 1.0], 1).run == 1
    )
    nan = beside_spot(["a", "b"], [float("nan"), 0.44], [True, True], [True, True], [2.0] * 2, [1.0] * 2)
    assert nan is not None and nan.run == 1

"""SpotGuard's own capacity policy: the pool history it learns from, the plan it makes, and that it never
misses a deadline on-demand could meet. Hand-made traces with 1-hour ticks keep the figures checkable."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from spotguard.domain.capacity.availability import NB, NC, AvailabilityHistory, age_bin
from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import Market, Situation
from spotguard.domain.capacity.planner import (
    RECHECK_MAX_SECONDS,
    RECHECK_MIN_SECONDS,
    JobNeeds,
    PoolOption,
    choose_capacity,
)
from spotguard.domain.capacity.plans import (
    FAR_BUDGET,
    FINE_BUDGET,
    MAX_FINE_TICKS,
    JointPlan,
    Plan,
    plan_grid,
)
from spotguard.domain.capacity.rules import pick_two
from spotguard.domain.capacity.simulated import SpotGuardPolicy
from spotguard_cli.simulator import Job, Prices, Trace, simulate

PRICES = Prices(spot=1.0, on_demand=3.0)


def trace(*bits: int, name: str = "t") -> Trace:
    return Trace(name, 1.0, tuple(bool(b) for b in bits))


def test_history_counts_runs_by_age():
    h = AvailabilityHistory(tick_hours=1.0, half_life_hours=1e9, prior_ticks=0.0)
    h.observe_all([1, 1, 1, 0, 0, 1])
    # a 3-tick available run ended at age 3; an unavailable run ended at age 2; a new run is at age 1
    assert (h.state, h.age) == (1, 1)
    assert h.ends[1, age_bin(3)] == pytest.approx(1) and h.ends[0, age_bin(2)] == pytest.approx(1)
    assert h.exposure[1, age_bin(1)] == pytest.approx(2) and h.exposure[1, age_bin(2)] == pytest.approx(1)
    hz = h.hazards()
    assert hz[0, age_bin(2)] == pytest.approx(0.98)  # every unavailable run seen ended at 2 (clipped)
    assert hz[1, age_bin(1)] == pytest.approx(1e-4)  # none ended at age 1


def test_history_decays_and_falls_back_to_the_prior():
    flat = AvailabilityHistory(tick_hours=1.0, prior_mean_hours=(4.0, 10.0), heavy_tailed_prior=False)
    assert flat.hazards()[0] == pytest.approx(np.full(NB, 0.25))
    assert flat.hazards()[1] == pytest.approx(np.full(NB, 0.1))
    heavy = AvailabilityHistory(tick_hours=1.0, prior_mean_hours=(4.0, 10.0)).hazards()
    assert heavy[0, 0] == pytest.approx(1 / 5) and heavy[1, 0] == pytest.approx(1 / 11)
    assert all(np.diff(heavy[0]) < 0) and all(
        np.diff(heavy[1]) < 0
    )  # the longer it lasted, the likelier it lasts
    h = AvailabilityHistory(tick_hours=1.0, half_life_hours=1.0, prior_ticks=0.0)
    h.observe_all([0, 1, 1])
    assert h.exposure[1, age_bin(1)] == pytest.approx(1.0 * 0.5 + 0)  # observed one tick ago: half weight
    h.gap()
    assert h.state is None and h.bin_if(True) == 0  # the current run's age is forgotten


def test_a_long_lived_pool_is_expected_to_last():
    steady = AvailabilityHistory(tick_hours=1.0)
    steady.observe_all([1] * 200)
    choppy = AvailabilityHistory(tick_hours=1.0)
    choppy.observe_all([1, 0] * 100 + [1])
    assert steady.expected_spot_ticks() > 10 * choppy.expected_spot_ticks()
    # Spot is not available now: a fresh run's expected length, the same whatever the outage's age.
    steady.observe(False)
    fresh = steady.expected_spot_ticks()
    steady.observe_all([False] * 5)
    assert fresh > 10 and steady.expected_spot_ticks() == pytest.approx(fresh, rel=0.05)


def plan_for(hazard_off: float, hazard_on: float, ticks: int, slack_units: int) -> Plan:
    hz = np.array([[hazard_off] * NB, [hazard_on] * NB])
    return Plan(hz, ticks, slack_units, k=2, d=1, spot_price=1.0, on_demand_price=3.0, tick_hours=1.0)


def test_the_plan_takes_spot_that_lasts_and_waits_for_spot_that_comes_back():
    plan = plan_for(hazard_off=0.9, hazard_on=0.01, ticks=10, slack_units=10)
    # 10 ticks left, 5 h of slack (units of half an hour): nothing held, spot available -> spot
    assert plan.choose(10, 0, 1, 0, 10) == 2
    # spot unavailable but it comes back almost surely next tick -> wait
    assert plan.choose(10, 0, 0, 0, 10) == 0


def test_the_plan_goes_on_demand_when_spot_stays_away_and_slack_is_short():
    plan = plan_for(hazard_off=0.01, hazard_on=0.5, ticks=10, slack_units=4)
    assert plan.choose(10, 0, 0, 0, 2) == 1


def test_the_plan_keeps_on_demand_rather_than_a_spot_blip():
    # Spot runs last one tick: switching from on-demand would pay the overhead and lose it again.
    plan = plan_for(hazard_off=0.3, hazard_on=0.98, ticks=12, slack_units=4)
    assert plan.choose(12, plan.od_class[0], 1, 0, 4) == 1


def test_spot_all_the_way_when_it_never_goes():
    r = simulate(SpotGuardPolicy(1.0, 3.0), [trace(*[1] * 8)], 0, Job(3.0, 6.0, 0.5), PRICES)
    assert (r.spot_hours, r.ondemand_hours, r.cost, r.launches) == (3.0, 0.0, 3.5, 1)


def test_no_spot_at_all_is_on_demand_in_time():
    r = simulate(SpotGuardPolicy(1.0, 3.0), [trace(*[0] * 8)], 0, Job(3.0, 6.0, 0.5), PRICES)
    assert not r.missed and r.ondemand_hours == 3.0 and r.spot_hours == 0.0
    assert r.cost == pytest.approx(3.0 * 3.5)


@pytest.mark.parametrize("seed", range(12))
def test_never_misses_a_deadline_on_demand_could_meet(seed):
    rng = random.Random(seed)
    gap = rng.choice([1.0, 0.5, 1 / 6])
    n = 240
    p_stay = rng.uniform(0.5, 0.98)
    bits, a = [], 1
    for _ in range(n):
        a = a if rng.random() < p_stay else 1 - a
        bits.append(a)
    pools = [Trace("t", gap, tuple(bool(b) for b in bits))]
    for name in rng.choice([(), ("u",), ("u", "v")]):  # one, two or three pools
        pools.append(Trace(name, gap, tuple(rng.random() < 0.4 for _ in range(n))))
    restart = rng.choice([0.0, gap / 2, 0.2])
    hours = rng.uniform(2.0, 10.0)
    job = Job(hours, hours + restart + rng.uniform(0.0, 8.0), restart)
    policy = SpotGuardPolicy(1.0, 3.0)
    policy.remember([t.available[:40] for t in pools])
    r = simulate(policy, pools, 40, job, PRICES)
    assert not r.missed
    assert r.spot_hours + r.ondemand_hours == pytest.approx(hours)


def test_with_two_pools_it_takes_the_one_that_lasts():
    steady = trace(*[1] * 30, name="steady")
    choppy = trace(*[1, 0] * 15, name="choppy")
    policy = SpotGuardPolicy(1.0, 3.0)
    policy.remember([choppy.available[:20], steady.available[:20]])
    r = simulate(policy, [choppy, steady], 20, Job(4.0, 8.0, 0.5), PRICES)
    assert {pool for placement, pool in r.placements if placement is Market.SPOT} == {1}


def test_pick_two_holds_on_then_takes_the_cheapest():
    costs, up = [3.0, 1.0, 2.0, 1.5], [True, False, True, True]
    assert pick_two(costs, up, held=0) == [0, 1]  # the held pool, then the cheapest of the rest
    assert pick_two(costs, up, held=None) == [3, 1]  # the cheapest with spot now, then the cheapest
    assert pick_two(costs, [False] * 4, held=None) == [1, 3]  # none has spot: the two cheapest
    with pytest.raises(ValueError):
        pick_two([1.0], [True], None)


def test_with_three_pools_it_takes_spot_outside_the_planned_pair():
    # Pools 0 and 1 lasted before the job but are down during it; pool 2 was choppy before, and is up
    # from the job's third hour: the plan made at the start covered pools 0 and 1 only.
    before = 40
    good = [1] * before + [0] * 20
    late = [1, 0] * (before // 2) + [0, 0] + [1] * 18
    pools = [trace(*good, name="a"), trace(*good, name="b"), trace(*late, name="c")]
    policy = SpotGuardPolicy(1.0, 3.0)
    policy.remember([t.available[:before] for t in pools])
    r = simulate(policy, pools, before, Job(6.0, 12.0, 0.5), PRICES)
    assert not r.missed and r.spot_hours > 0
    assert {pool for placement, pool in r.placements if placement is Market.SPOT} == {2}


def test_judging_a_pool_leaves_its_history_as_it_was():
    history = AvailabilityHistory(1 / 6)
    history.observe_all([True] * 20 + [False] * 5)
    exposure, ends = history.exposure.copy(), history.ends.copy()
    job = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=9)
    choose_capacity(job, [PoolOption("a", 1, 1.0, 3.0, False, history), pool("b", True, STEADY)])
    assert np.array_equal(history.exposure, exposure) and np.array_equal(history.ends, ends)


def joint_for(hazards: list[tuple[float, float]], ticks: int, slack_units: int) -> JointPlan:
    """Two pools, each (hazard of an outage ending, hazard of a spot run ending), the same at every age."""
    hz = [np.array([[off] * NC, [on] * NC]) for off, on in hazards]
    return JointPlan(hz, ticks, slack_units, 2, 1, (1.0, 1.0), 3.0, 1.0, keep_ticks=ticks)


def state(available: int, coarse_bin: int = 0) -> int:
    return available * NC + coarse_bin


def test_the_joint_plan_takes_the_pool_that_has_spot():
    plan = joint_for([(0.5, 0.05), (0.5, 0.05)], ticks=10, slack_units=10)
    assert plan.choose(10, 0, [state(0), state(1)], 10) == 3  # spot in pool 1
    assert plan.choose(10, 0, [state(1), state(0)], 10) == 2  # spot in pool 0


def test_the_joint_plan_keeps_the_pool_it_holds_rather_than_pay_a_restart():
    plan = joint_for([(0.5, 0.05), (0.5, 0.05)], ticks=10, slack_units=10)
    held = plan.holding(Market.SPOT, 0, 0.0, 0.5)
    assert plan.choose(10, held, [state(1), state(1)], 10) == 2
    held = plan.holding(Market.SPOT, 1, 0.0, 0.5)
    assert plan.choose(10, held, [state(1), state(1)], 10) == 3


def test_the_joint_plan_prefers_the_pool_whose_runs_last():
    # Pool 0's runs end almost every tick (each launch pays the overhead and is lost); pool 1's last.
    plan = joint_for([(0.5, 0.9), (0.5, 0.02)], ticks=12, slack_units=8)
    assert plan.choose(12, 0, [state(1), state(1)], 8) == 3


def test_the_joint_plan_moves_from_on_demand_to_spot_that_lasts_but_not_to_a_blip():
    # Pool 0's spot lasts a tick; pool 1's outages and runs both last.
    plan = joint_for([(0.5, 0.98), (0.01, 0.01)], ticks=12, slack_units=6)
    on_demand = plan.holding(Market.ON_DEMAND, None, 0.0, 0.5)
    assert plan.choose(12, on_demand, [state(1), state(0)], 6) == 1
    assert plan.choose(12, on_demand, [state(0), state(1)], 6) == 3


def test_the_joint_plan_keeps_only_the_ticks_it_was_asked_for():
    plan = JointPlan([np.full((2, NC), 0.1)] * 2, 10, 4, 2, 1, (1.0, 1.0), 3.0, 1.0, keep_ticks=3)
    assert plan.choose(8, 0, [state(1), state(1)], 4) in (0, 1, 2, 3)
    with pytest.raises(ValueError):
        plan.choose(7, 0, [state(1), state(1)], 4)


def test_the_safety_net_has_the_last_word():
    policy = SpotGuardPolicy(1.0, 3.0)
    policy.reset(4.0, 5.0, 0.5)
    s = Situation(
        elapsed_hours=0.0,
        work_left_hours=4.0,
        time_left_hours=5.0,
        placement=Market.NONE,
        pool=None,
        overhead_left_hours=0.0,
        spot_available=(False,),
        tick_hours=1.0,
        restart_hours=0.5,
    )
    assert policy.decide(s).placement is Market.ON_DEMAND


# ------------------------------------------------------------------ one decision, as the Lambdas will ask


def pool(name: str, available: bool, pattern: list[int] | None = None, **kw) -> PoolOption:
    history = None
    if pattern is not None:
        history = AvailabilityHistory(1 / 6)
        history.observe_all([bool(b) for b in pattern])
    fields = {"gpus_per_instance": 1, "spot_price": 1.0, "on_demand_price": 3.0, **kw}
    return PoolOption(name, available=available, history=history, **fields)


STEADY = [1] * 300 + [0] * 3 + [1] * 300
CHOPPY = [1, 1, 0, 0] * 150 + [1]


def test_without_deadline_the_cheapest_spot_per_hour_of_work():
    job = JobNeeds(gpus=1, work_left_hours=10, restart_hours=0.2, time_left_hours=None)
    d = choose_capacity(job, [pool("choppy", True, CHOPPY, spot_price=0.8), pool("steady", True, STEADY)])
    # the choppy pool is cheaper per hour but pays a restart every 20 minutes
    assert (d.placement, d.pool) == (Market.SPOT, "steady")


def test_without_deadline_a_bounded_wait_then_on_demand():
    pools = [
        pool("small", False, gpus_per_instance=1, on_demand_price=3.0),
        pool("big", False, gpus_per_instance=8, on_demand_price=20.0),
    ]
    job = JobNeeds(gpus=1, work_left_hours=10, restart_hours=0.2, time_left_hours=None, max_wait_hours=1.0)
    waiting = choose_capacity(job, pools)
    assert waiting.placement is Market.NONE and "0 of 1 h" in waiting.reason
    late = choose_capacity(
        JobNeeds(gpus=1, work_left_hours=10, restart_hours=0.2, time_left_hours=None, waited_hours=1.0), pools
    )
    assert (late.placement, late.instance_pool) == (Market.ON_DEMAND, "big")  # 2.5 $ per GPU-hour


@pytest.mark.parametrize("time_left", [None, 3.0])
def test_a_job_no_pool_fits_is_not_servable(time_left):
    job = JobNeeds(gpus=4, work_left_hours=1, restart_hours=0.1, time_left_hours=time_left)
    d = choose_capacity(job, [pool("a", True), pool("b", False)])
    assert (d.placement, d.pool, d.servable) == (Market.NONE, None, False)
    assert d.reason == "no pool has 4 GPUs per instance" and d.expected_cost is None
    assert choose_capacity(job, []).servable is False
    assert d.instance_pool is None


@pytest.mark.parametrize(
    ("available", "time_left", "placement"),
    [(True, None, "spot"), (False, None, "none"), (False, 1.3, "on-demand")],
)
def test_the_answer_is_the_decision_the_job_records(available, time_left, placement):
    """The policy answers with the job's own decision type, whose placement is stored and sent as the
    same strings as ever."""
    job = JobNeeds(gpus=1, work_left_hours=1, restart_hours=0.1, time_left_hours=time_left)
    d = choose_capacity(job, [pool("a", available)])
    assert isinstance(d, PlacementDecision) and d.placement == placement
    assert d.model_dump(mode="json")["placement"] == placement
    assert f'"placement":"{placement}"' in d.model_dump_json()
    assert PlacementDecision.model_validate_json(d.model_dump_json()) == d


def test_with_a_deadline_spot_that_lasts():
    job = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=9)
    d = choose_capacity(job, [pool("steady", True, STEADY)])
    assert (d.placement, d.pool) == (Market.SPOT, "steady")


def test_with_a_deadline_wait_out_a_short_outage_but_not_the_deadline():
    short_outages = [1] * 30 + ([0] * 2 + [1] * 30) * 20 + [0]
    job = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=9)
    assert choose_capacity(job, [pool("a", False, short_outages)]).placement is Market.NONE
    tight = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=6.3)
    d = choose_capacity(tight, [pool("a", False, short_outages)])
    assert d.placement is Market.ON_DEMAND and "deadline" in d.reason
    late = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=5)
    assert "cannot be met" in choose_capacity(late, [pool("a", True)]).reason


SHORT_OUTAGES = [1] * 30 + ([0] * 2 + [1] * 30) * 20 + [0]


def test_with_a_deadline_and_two_pools_the_joint_plan_picks_the_pool_that_lasts():
    job = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=9)
    pools = [pool("choppy", True, CHOPPY, spot_price=0.8), pool("steady", True, STEADY)]
    d = choose_capacity(job, pools)
    assert (d.placement, d.pool) == (Market.SPOT, "steady")
    assert "choppy" in d.reason and "steady" in d.reason


def test_with_a_deadline_and_two_pools_down_wait_or_on_demand():
    pools = [pool("a", False, SHORT_OUTAGES), pool("b", False, SHORT_OUTAGES)]
    roomy = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=9)
    assert choose_capacity(roomy, pools).placement is Market.NONE
    tight = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=6.3)
    assert choose_capacity(tight, pools).placement is Market.ON_DEMAND


def test_with_a_deadline_the_job_moves_pools_only_when_the_restart_pays():
    def decide(cheap_price: float):
        pools = [
            pool("held", True, STEADY, spot_price=1.2),
            pool("cheap", True, STEADY, spot_price=cheap_price),
            pool("dear", True, STEADY, spot_price=1.5),
        ]
        job = JobNeeds(
            gpus=1,
            work_left_hours=6,
            restart_hours=0.2,
            time_left_hours=9,
            placement=Market.SPOT,
            pool="held",
        )
        return choose_capacity(job, pools)

    # 0.01 $/h less for 6 hours does not pay a 0.2 h restart; 0.7 $/h less does
    stay = decide(1.19)
    assert (stay.placement, stay.pool) == (Market.SPOT, "held")
    assert "cheap" in stay.reason and "dear" not in stay.reason
    move = decide(0.5)
    assert (move.placement, move.pool) == (Market.SPOT, "cheap")


# ------------------------------------------ what users expect, and a decision cheap enough for a Lambda

# Two g5.xlarge pools (1 GPU, $1.006/h on-demand), spot available now in both, no history yet.
G5 = {"gpus_per_instance": 1, "spot_price": 0.45, "on_demand_price": 1.006}


@pytest.mark.parametrize(("work", "deadline"), [(10.0, 20.0), (10.0, 60.0), (1.0, 200.0)])
@pytest.mark.parametrize("n_pools", [1, 2])
def test_spot_available_now_runs_now_whatever_the_deadline(work, deadline, n_pools):
    pools = [PoolOption(name, available=True, **G5) for name in ("a", "b")][:n_pools]
    job = JobNeeds(gpus=1, work_left_hours=work, restart_hours=0.2, time_left_hours=deadline)
    d = choose_capacity(job, pools)
    assert d.placement is Market.SPOT and d.servable
    # money (about the spot price per hour of work) plus the time value of the hours to the end
    assert d.expected_cost is not None and 0.45 * work < d.expected_cost < 1.006 * (work + 0.2) * 1.5
    assert d.recheck_seconds == RECHECK_MAX_SECONDS


def test_without_time_value_a_loose_deadline_may_wait_for_older_spot():
    # What the time value is for: priced at zero, waiting while spot is there can look as good.
    pools = [PoolOption(name, available=True, **G5) for name in ("a", "b")]
    free = JobNeeds(gpus=1, work_left_hours=10, restart_hours=0.2, time_left_hours=60, time_value_per_hour=0)
    valued = JobNeeds(gpus=1, work_left_hours=10, restart_hours=0.2, time_left_hours=60)
    assert choose_capacity(valued, pools).placement is Market.SPOT
    waiting = choose_capacity(free, pools)
    if waiting.placement is Market.NONE:
        assert RECHECK_MIN_SECONDS <= waiting.recheck_seconds <= RECHECK_MAX_SECONDS


def test_without_deadline_no_plan_and_a_bounded_recheck():
    job = JobNeeds(gpus=1, work_left_hours=5, restart_hours=0.2, time_left_hours=None, waited_hours=0.95)
    d = choose_capacity(job, [pool("a", False), pool("b", False)])
    assert d.placement is Market.NONE and d.expected_cost is None
    assert d.recheck_seconds == 180  # what is left of the hour's wait
    nearly = JobNeeds(gpus=1, work_left_hours=5, restart_hours=0.2, time_left_hours=None, waited_hours=0.999)
    assert choose_capacity(nearly, [pool("a", False)]).recheck_seconds == RECHECK_MIN_SECONDS
    run = choose_capacity(job, [pool("a", True)])
    assert run.placement is Market.SPOT and run.expected_cost is None


def test_waiting_with_a_deadline_rechecks_within_a_tick():
    pools = [pool("a", False, SHORT_OUTAGES), pool("b", False, SHORT_OUTAGES)]
    roomy = JobNeeds(gpus=1, work_left_hours=6, restart_hours=0.2, time_left_hours=9)
    d = choose_capacity(roomy, pools)
    assert d.placement is Market.NONE and d.recheck_seconds == 600 and d.expected_cost is not None


@pytest.mark.parametrize("joint", [False, True])
def test_the_plans_work_is_bounded_whatever_the_deadline(joint):
    """The values a plan computes stay within its budgets as the deadline loosens (the fine grid's window
    of slack is the same whatever the deadline; its ticks differ by less than a far step, fitted to it)."""
    k, d = plan_grid(1 / 6, 0.2)
    unit = (1 / 6) / k

    def make(deadline: float) -> Plan | JointPlan:
        ticks, slack = round(deadline * 6), math.floor((deadline - 10) / unit)
        if joint:
            hz = [np.full((2, NC), 0.05)] * 2
            return JointPlan(
                hz, ticks, slack, k, d, (0.45, 0.45), 1.0, 1 / 6, keep_ticks=1, time_value_per_hour=0.05
            )
        return Plan(np.full((2, NB), 0.05), ticks, slack, k, d, 0.45, 1.0, 1 / 6, keep_all=False)

    plans = {r: make(r) for r in (60.0, 200.0, 2000.0)}
    for p in plans.values():
        fine, far = p.work
        assert fine <= FINE_BUDGET and 0 < far <= FAR_BUDGET
        assert (
            p.horizon.fine_ticks <= MAX_FINE_TICKS * 1.5 and p.value.shape[-1] <= p.horizon.fine_ticks * k + 1
        )
    assert plans[2000.0].horizon.step > plans[200.0].horizon.step >= plans[60.0].horizon.step


def test_a_deadline_within_the_fine_horizon_is_planned_exactly():
    k, d = plan_grid(1 / 6, 0.2)
    p = Plan(np.full((2, NB), 0.05), 48, 60, k, d, 0.45, 1.0, 1 / 6)
    assert p.horizon.step == 0 and p.horizon.lo == 0 and p.kept_ticks == 48


def test_the_grid_rounds_an_odd_overhead_up_within_a_sixth_of_a_tick():
    assert plan_grid(1 / 6, 0.2) == (5, 6)  # exact: 1.2 ticks = 6 units of a fifth
    k, d = plan_grid(1 / 6, 0.137)  # exact only at 120 units per tick
    assert k <= 6 and 0.137 <= d * (1 / 6) / k < 0.137 + (1 / 6) / k
    assert plan_grid(1 / 6, 0.0) == (1, 0)


def test_a_far_deadline_is_met_and_spot_taken():
    # 4 h of work, 40 h to the deadline: the far grid plans most of it; the simulator follows the policy.
    bits = ([1] * 30 + [0] * 6) * 12
    pools = [Trace("t", 1 / 6, tuple(bool(b) for b in bits))]
    policy = SpotGuardPolicy(1.0, 3.0)
    policy.remember([pools[0].available[:120]])
    r = simulate(policy, pools, 120, Job(4.0, 40.0, 0.2), PRICES)
    assert not r.missed and r.spot_hours > 3.0


def test_the_far_grid_ends_at_the_deadline():
    """A far grid whose deadline came early (by the ticks beyond a whole number of its steps, up to a step)
    took that much slack from the job at the junction: 6 ticks here, an hour of 2.5, and the joint plan,
    whose steps are the coarsest, expected $5.6 more than an exact plan and chose otherwise in 72 states.
    The fine grid now takes those ticks (or hands a step's start to the far grid): the plan agrees."""
    k, d = plan_grid(1 / 6, 0.2)
    hz = [np.stack([np.full(NC, 0.1), np.full(NC, 0.04)]), np.stack([np.full(NC, 0.2), np.full(NC, 0.08)])]
    ticks, slack = 130, round(2.5 * 6 * k)

    def make(**budgets: int) -> JointPlan:
        return JointPlan(
            hz, ticks, slack, k, d, (0.9, 1.0), 3.06, 1 / 6, 1, time_value_per_hour=0.15, **budgets
        )

    exact = make(fine_budget=10**12, max_fine_ticks=10**6)
    bounded = make(fine_budget=300_000, far_budget=100_000)
    assert exact.horizon.step == 0 and bounded.horizon.step > 1 and bounded.horizon.lost_ticks == 0
    assert (bounded.actions[0, ..., -1] == exact.actions[0, ..., -1]).all()
    assert np.abs(bounded.value[..., -1] - exact.value[..., -1]).max() < 1.5


def test_the_fine_grid_computes_only_the_slack_the_job_can_reach():
    """The triangle of reachable slack gives the plan the window's values, at half the work."""
    k, d = plan_grid(1 / 6, 0.2)
    hz = [np.full((2, NC), 0.1), np.stack([np.full(NC, 0.2), np.full(NC, 0.05)])]
    plan = JointPlan(hz, 40, 300, k, d, (0.9, 1.0), 3.06, 1 / 6, 40, max_fine_ticks=40)
    assert plan.horizon.step == 0  # exact: one grid, the window of slack 300 - 40 K .. 300 reachable
    fine, _ = plan.work
    assert fine < 0.55 * 40 * (40 * k + 1) * np.prod(plan.value.shape[:-1])
    shorter = JointPlan(hz, 39, 300 - k, k, d, (0.9, 1.0), 3.06, 1 / 6, 1, max_fine_ticks=39)
    cls, states = 0, (NC, 0)
    assert plan.choose(39, cls, states, 300 - k) == shorter.choose(39, cls, states, 300 - k)

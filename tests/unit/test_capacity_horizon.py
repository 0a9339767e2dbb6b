"""Issue 29: a far deadline made the planner take minutes and gigabytes.

No test here times anything (a shared machine makes timings flaky): the plan's size and a decision's
peak memory are deterministic, and they are what grew with the deadline. The timings are in
`bench/decide.py --horizons`."""

from __future__ import annotations

import math
import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.capacity import rules
from spotguard.domain.capacity.planner import JobNeeds, PoolOption, choose_capacity
from spotguard.domain.capacity.plans import (
    FAR_BUDGET,
    FINE_BUDGET,
    SLACK_CAP_HOURS,
    SLACK_CAP_WORK,
    JointPlan,
    Plan,
    collapse,
    plan_grid,
)
from spotguard.domain.capacity.simulated import SpotGuardPolicy
from spotguard.domain.jobs.model import MAX_DEADLINE_HOURS
from spotguard.domain.jobs.placement import job_needs
from spotguard.domain.jobs.request import deadline_refused

TICK = 1 / 6
NOW = datetime(2026, 11, 26, 12, tzinfo=UTC)
DOOR = NOW + timedelta(hours=MAX_DEADLINE_HOURS)  # the furthest deadline submit accepts


def _fresh_pools(n: int = 2) -> list[PoolOption]:
    return [PoolOption(f"p{i}", 1, 1.0 + 0.1 * i, 3.06, True) for i in range(n)]


def _covered_ticks(plan: Plan | JointPlan) -> int:
    """The ticks the plan's grids cover: the fine ones, the far steps, and a far deadline come early."""
    h = plan.horizon
    return h.fine_ticks + h.far_steps * h.step + h.lost_ticks


def _plans_of(monkeypatch: pytest.MonkeyPatch) -> list[Plan | JointPlan]:
    """The plans choose_capacity makes, as it makes them."""
    made: list[Plan | JointPlan] = []

    class SpyJoint(JointPlan):
        def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, **kw)
            made.append(self)

    class SpyPlan(Plan):
        def __init__(self, *a, **kw) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(rules, "JointPlan", SpyJoint)
    monkeypatch.setattr(rules, "Plan", SpyPlan)
    return made


def _door_needs(work_hours: float | None) -> JobNeeds:
    """What the Lambdas ask for a job just submitted with the furthest deadline the door accepts."""
    assert deadline_refused(DOOR, NOW) is None
    needs = job_needs(1, [], [], work_hours, NOW, DOOR, NOW)
    return JobNeeds(1, needs.work_left_hours, needs.restart_hours, needs.time_left_hours)


# --------------------------------------------------------------------------- the plan's size and cost
@pytest.mark.parametrize("pools", [1, 2])
@pytest.mark.parametrize("left", [10.0, 1e3, 1e6, "door", "door, no estimate"])
def test_the_plan_covers_a_bounded_horizon_whatever_the_deadline(monkeypatch, pools, left):
    """A deadline a million hours off planned all of it: far steps of thousands of hours, 6 million ticks,
    10 s and 650 MB for one decision. Slack beyond max(500 h, 50 x the work) is now left out of the plan: the
    ticks it covers, and its values, are bounded by the work and the budgets, not by the deadline."""
    made = _plans_of(monkeypatch)
    if isinstance(left, str):
        job = _door_needs(5.0 if left == "door" else None)
    else:
        job = JobNeeds(1, 5.0, 0.2, left)
    choose_capacity(job, _fresh_pools(pools))
    (plan,) = made
    assert isinstance(plan, JointPlan if pools == 2 else Plan)
    slack = min(
        job.time_left_hours - job.work_left_hours,
        max(SLACK_CAP_HOURS, SLACK_CAP_WORK * 1.1 * job.work_left_hours),
    )
    assert _covered_ticks(plan) <= math.ceil((job.work_left_hours + slack) / TICK) + 1
    fine, far = plan.work
    assert fine <= FINE_BUDGET and far <= FAR_BUDGET


@pytest.mark.parametrize(
    "job",
    [
        JobNeeds(1, 5.0, 0.2, 1e6),
        JobNeeds(1, 5.0, 0.2, 1e12),
        JobNeeds(1, 1e6, 0.2, 2e6),  # beyond any job the door accepts, bounded all the same
        _door_needs(5.0),
        _door_needs(None),  # no estimate: the work fills half the time, 4,380 h
    ],
    ids=["1e6 h left", "1e12 h left", "1e6 h of work", "door", "door, no estimate"],
)
def test_a_far_deadline_takes_little_memory(job):
    """Peak memory is deterministic where time is not: 650 MB at a million hours before (the far step's
    hazards were stretched over an array of its ticks), a few MB now."""
    choose_capacity(job, _fresh_pools(2))  # numpy's own first allocations out of the way
    tracemalloc.start()
    try:
        choose_capacity(job, _fresh_pools(2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20


def test_slack_beyond_the_cap_changes_nothing():
    """The far end is the deadline's safety net, not time to plan: past the cap, every deadline is
    planned as the cap, with the same decision and the same cost."""
    pools = _fresh_pools(2)
    first = choose_capacity(JobNeeds(1, 5.0, 0.2, 1e3), pools)
    assert first.expected_cost is not None
    for left in (8760.0, 1e5, 1e6, 1e12):
        d = choose_capacity(JobNeeds(1, 5.0, 0.2, left), pools)
        assert (d.placement, d.pool, d.expected_cost) == (first.placement, first.pool, first.expected_cost)


def test_ordinary_deadlines_are_planned_whole():
    """Slack up to 50 times the work, or up to 500 hours, is never left out: those decisions are the same
    as before the cap."""
    for restart in (0.05, 0.2, 0.5, 1.1492):
        k, d = plan_grid(TICK, restart)
        unit = TICK / k
        for work in (0.5, 1.0, 5.0, 20.0, 48.0, 200.0):
            for slack_hours in (0.0, work, 10 * work, 50 * work, 480.0):
                ticks = round((work + slack_hours) / TICK)
                slack = math.floor(slack_hours / unit + 1e-6)
                assert collapse(ticks, slack, k, d, TICK) == 0, (restart, work, slack_hours)


def test_the_simulator_follows_a_collapsed_plan_to_its_deadline():
    """The simulated policy looks its plan up by the real ticks and slack; the plan shifts them."""
    from spotguard_cli.simulator.policy_run import Job, Prices, simulate
    from spotguard_cli.simulator.traces import Trace

    bits = tuple(bool(b) for b in ([1] * 30 + [0] * 40) * 200)
    for pools in (1, 2):
        traces = [Trace(f"t{i}", TICK, bits[i * 7 :]) for i in range(pools)]
        policy = SpotGuardPolicy(1.0, 3.0)
        policy.remember([t.available[:120] for t in traces])
        r = simulate(policy, traces, 120, Job(4.0, 1000.0, 0.2), Prices(1.0, 3.0))
        assert not r.missed and r.spot_hours > 3.0

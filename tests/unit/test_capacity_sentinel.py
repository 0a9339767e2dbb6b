"""Issue 29: the plan's sentinel for a missed deadline (1e12, weighted by the chance of the miss) reached
users as a cost: "$585,066,086,400 to finish". It is never a cost: the decision says that the deadline
cannot be met for certain and what is done instead, and carries no cost."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from spotguard.domain.capacity.availability import NB
from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import Market
from spotguard.domain.capacity.planner import JobNeeds, PoolOption, choose_capacity
from spotguard.domain.capacity.plans import INF, Plan, plan_grid

TICK = 1 / 6


@pytest.mark.parametrize("b_has_spot", [True, False])
def test_the_sentinel_for_a_miss_never_reaches_a_reason_as_a_cost(b_has_spot):
    """The issue's input: the plan's grid rounds the 1.1492 h restart up to 1.1667 h, so losing spot in a
    leaves no time for a restart; every action risks the deadline, and the plan's value was INF weighted
    by that risk. It keeps the spot instance it holds (the likeliest way to meet the deadline) and says
    that the deadline cannot be met for certain, with no cost."""
    pools = [
        PoolOption("a", 1, 12.62, 18.04, True),
        PoolOption("b", 1, 2.89, 12.31, b_has_spot),
    ]
    job = JobNeeds(1, 3.1476, 1.1492, 4.3, placement=Market.SPOT, pool="a")
    d = choose_capacity(job, pools)
    assert (d.placement, d.pool) == (Market.SPOT, "a")
    assert d.expected_cost is None
    assert d.reason == (
        "the deadline cannot be met for certain any more: keep spot in a, the likeliest way to meet it"
    )
    at = datetime(2026, 11, 26, tzinfo=UTC)
    shown = PlacementDecision(
        at=at, placement="spot", pool="a", reason=d.reason, expected_cost=d.expected_cost
    )
    assert "$" not in shown.summary() and "585" not in shown.summary()


def test_a_plan_tells_its_sentinel_from_a_cost():
    k, d = plan_grid(TICK, 1.1492)
    plan = Plan(np.full((2, NB), 0.05), 26, 6, k, d, 12.62, 18.04, TICK, keep_all=False)
    assert plan.meets_deadline(26 * TICK * 18.04)  # on-demand every tick to the deadline: a cost
    assert not plan.meets_deadline(1e-6 * INF)  # a one-in-a-million miss: the sentinel's weight
    value = plan.expected_cost(0, 1, 0, 6)  # nothing held, spot there, slack below a restart
    assert value > 1e6 and not plan.meets_deadline(value)


def test_a_cost_is_still_shown_where_the_deadline_is_safe():
    pools = [PoolOption("a", 1, 12.62, 18.04, True), PoolOption("b", 1, 2.89, 12.31, True)]
    d = choose_capacity(JobNeeds(1, 3.1476, 1.1492, 12.0), pools)
    assert d.expected_cost is not None and 0 < d.expected_cost < 12 * (18.04 + 0.05 * 12.31)
    assert "cannot be met" not in d.reason


def test_a_job_on_spot_that_cannot_meet_its_deadline_stays_where_it_finishes_soonest():
    """Found by CI's capacity demo: a job on spot with 8 steps (0.053 h) left and 0.05 h to its deadline
    was moved to on-demand 'to finish as soon as possible', a restart that made it finish later (and
    whose SIGUSR1 reached it as it ended). Where it runs, it finishes soonest."""
    pools = [PoolOption("a", 1, 0.45, 1.006, True, None, 8), PoolOption("b", 1, 0.45, 1.006, True, None, 8)]
    held = JobNeeds(1, 0.053, 0.03, 0.05, placement=Market.SPOT, pool="a")
    answer = choose_capacity(held, pools, 1 / 6)
    assert answer.placement is Market.SPOT and answer.pool == "a"
    assert "the spot instance it holds finishes soonest" in answer.reason
    waiting = JobNeeds(1, 0.053, 0.03, 0.05)  # not running: on-demand is the soonest
    assert choose_capacity(waiting, pools, 1 / 6).placement is Market.ON_DEMAND

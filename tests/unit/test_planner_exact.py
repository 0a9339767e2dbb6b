"""The plans are exact for their own model: on availability drawn from the very Markov chain a plan
assumes (hazard per age bin, the bin advancing by chance), following the plan costs on average what the
plan says it will, and no baseline does better on the same draws. This ties the dynamic programme's
bookkeeping (restart overhead in slack units, preemption at the tick boundary, the last part tick) to
the simulator's, which is what every benchmark figure is measured with.

The draws come from a fixed seed; the tolerance is four standard errors of the simulated mean."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from spotguard.domain.capacity.availability import ADVANCE, NB, NC, NEXT_BIN, coarse_transitions
from spotguard.domain.capacity.model import (
    Choice,
    GreedyPolicy,
    Market,
    Situation,
    UniformProgressPolicy,
    slack_grid,
)
from spotguard.domain.capacity.plans import JointPlan, Plan
from spotguard_cli.simulator import Job, Prices, Trace, simulate

TICK = 1 / 6  # 10 minutes, as in the real traces
PRICES = Prices()


def grid(job: Job) -> tuple[int, float, int, int, int]:
    """(K, unit hours, overhead units, ticks, slack units): the plans' discretisation of the job."""
    k = slack_grid(TICK, job.restart_hours)
    unit = TICK / k
    ticks = math.ceil(job.deadline_hours / TICK - 1e-9)
    slack = math.floor((job.deadline_hours - job.hours) / unit + 1e-6)
    return k, unit, round(job.restart_hours / unit), ticks, slack


class Follow:
    """Does what the plan says, given the chain's hidden age bins (which the plan's states are)."""

    name = "follow"

    def __init__(self, choose: Callable[[int, int, Situation, int], int], unit: float, ticks: int) -> None:
        """`choose(tick, ticks left, situation, slack units)`: the plan's action for that tick."""
        self.choose, self.unit, self.ticks = choose, unit, ticks

    def reset(self, job_hours: float, deadline_hours: float, restart_hours: float) -> None:
        pass

    def decide(self, s: Situation) -> Choice:
        i = round(s.elapsed_hours / TICK)
        slack = math.floor((s.time_left_hours - s.work_left_hours) / self.unit + 1e-6)
        action = self.choose(i, self.ticks - i, s, slack)
        if action == 0:
            return Choice(Market.NONE, None, "wait")
        if action == 1:
            return Choice(Market.ON_DEMAND, None, "on-demand")
        return Choice(Market.SPOT, action - 2, "spot")


def check(costs: list[float], planned: float, baselines: dict[str, list[float]]) -> None:
    mean, se = float(np.mean(costs)), float(np.std(costs) / math.sqrt(len(costs)))
    assert abs(mean - planned) < 4 * se, f"simulated {mean:.3f} +- {se:.3f}, planned {planned:.3f}"
    for name, other in baselines.items():
        assert mean < float(np.mean(other)), f"{name} is cheaper than the plan on its own model"


@pytest.mark.slow  # 1,500 simulated runs per case: 1.5-3.5 s each here
@pytest.mark.parametrize(
    ("job", "available_first", "time_value"),
    [
        (Job(4.0, 6.0, 0.2), False, 0.0),  # the overhead is 1.2 ticks: 6 units of 1/5 tick
        (Job(4.0, 6.0, 0.2), True, 0.0),
        (Job(8.0, 10.0, 0.3), False, 0.0),  # 1.8 ticks
        (Job(5.0, 8.0, 0.5), True, 0.0),  # 3 whole ticks
        (Job(4.0, 6.0, 0.2), False, 0.5),  # each hour unfinished costs $0.5 more: the plan counts it
    ],
)
def test_the_single_pool_plan_costs_what_it_expects(job, available_first, time_value):
    hazards = np.stack([np.full(NB, 0.25), np.full(NB, 0.08)])
    hazards[1, :3] = (0.4, 0.3, 0.2)  # young spot runs end more often
    k, unit, d, ticks, slack = grid(job)
    plan = Plan(
        hazards, ticks, slack, k, d, PRICES.spot, PRICES.on_demand, TICK, time_value_per_hour=time_value
    )
    rng = np.random.default_rng(7)
    costs: list[float] = []
    baselines: dict[str, list[float]] = {"uniform progress": [], "greedy": []}
    for _ in range(1500):
        a, b = int(available_first), 0
        avail, bins = [], []
        for _ in range(ticks):  # the plan's chain: the run ends, else its age bin advances by chance
            avail.append(bool(a))
            bins.append(b)
            if rng.random() < hazards[a, b]:
                a, b = 1 - a, 0
            elif rng.random() < ADVANCE[b]:
                b = int(NEXT_BIN[b])
        pool = [Trace("chain", TICK, tuple(avail))]

        def choose(i: int, left: int, s: Situation, sl: int, bins=bins) -> int:
            cls = plan.holding(s.placement, s.overhead_left_hours, unit)
            return plan.choose(left, cls, int(s.spot_available[0]), bins[i], sl)

        run = simulate(Follow(choose, unit, ticks), pool, 0, job, PRICES)
        assert not run.missed and run.finished_hours is not None
        costs.append(run.cost + time_value * run.finished_hours)
        for name, other in (("uniform progress", UniformProgressPolicy()), ("greedy", GreedyPolicy())):
            r = simulate(other, pool, 0, job, PRICES)
            baselines[name].append(r.cost + time_value * (r.finished_hours or job.deadline_hours))
    assert plan.horizon.step == 0  # exact: no far grid
    check(costs, plan.expected_cost(0, int(available_first), 0, slack), baselines)


@pytest.mark.parametrize("first_states", [(0, 0), (NC, 0)])
def test_the_joint_plan_costs_what_it_expects(first_states):
    job = Job(4.0, 6.0, 0.2)
    short_spot = np.stack([np.full(NC, 0.25), np.full(NC, 0.08)])
    short_spot[1, :2] = (0.4, 0.25)
    flaky = np.stack([np.full(NC, 0.10), np.full(NC, 0.15)])
    k, unit, d, ticks, slack = grid(job)
    plan = JointPlan(
        [short_spot, flaky],
        ticks,
        slack,
        k,
        d,
        (PRICES.spot, PRICES.spot),
        PRICES.on_demand,
        TICK,
        keep_ticks=ticks,
    )
    moves = [coarse_transitions(h) for h in (short_spot, flaky)]
    rng = np.random.default_rng(11)
    costs: list[float] = []
    baselines: dict[str, list[float]] = {"uniform progress on any pool": []}
    for _ in range(500):
        states = []
        for first, move in zip(first_states, moves, strict=True):
            path = [first]
            for _ in range(ticks - 1):
                path.append(int(rng.choice(2 * NC, p=move[path[-1]])))
            states.append(path)
        pools = [Trace(n, TICK, tuple(s >= NC for s in path)) for n, path in zip("ab", states, strict=True)]

        def choose(i: int, left: int, s: Situation, sl: int, states=states) -> int:
            held = s.pool if s.placement is Market.SPOT else None
            cls = plan.holding(s.placement, held, s.overhead_left_hours, unit)
            return plan.choose(left, cls, [states[0][i], states[1][i]], sl)

        run = simulate(Follow(choose, unit, ticks), pools, 0, job, PRICES)
        assert not run.missed
        costs.append(run.cost)
        baselines["uniform progress on any pool"].append(
            simulate(UniformProgressPolicy(), pools, 0, job, PRICES).cost
        )
    assert plan.horizon.step == 0
    check(costs, plan.expected_cost(0, first_states, slack), baselines)

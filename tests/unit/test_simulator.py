"""The capacity model's bookkeeping on tiny hand-made traces, the safety net, the omniscient bound,
and bad inputs. Hours are 1-hour ticks so that every figure can be checked by hand."""

from __future__ import annotations

import json
import random

import pytest

from spotguard.domain.capacity.model import (
    Choice,
    GreedyPolicy,
    Market,
    OnDemandPolicy,
    UniformProgressPolicy,
)
from spotguard_cli.simulator import Job, Prices, Trace, TraceError, load_trace, omniscient, simulate

PRICES = Prices(spot=1.0, on_demand=3.0)
JOB = Job(hours=2.0, deadline_hours=4.0, restart_hours=0.5)


def trace(*bits: int, name: str = "t") -> Trace:
    return Trace(name, 1.0, tuple(bool(b) for b in bits))


def test_spot_all_the_way():
    r = simulate(GreedyPolicy(), [trace(1, 1, 1, 1)], 0, JOB, PRICES)
    # tick 0: 0.5 h overhead + 0.5 h work; tick 1: 1 h work; tick 2: 0.5 h work, billed only that.
    assert (r.spot_hours, r.spot_billed_hours, r.cost) == (2.0, 2.5, 2.5)
    assert r.ondemand_hours == 0 and r.launches == 1 and r.finished_hours == 2.5 and not r.missed


def test_on_demand_all_the_way():
    r = simulate(OnDemandPolicy(), [trace(1, 1, 1, 1)], 0, JOB, PRICES)
    assert (r.ondemand_hours, r.ondemand_billed_hours, r.cost) == (2.0, 2.5, 7.5)


def test_greedy_waits_then_the_deadline_forces_on_demand():
    r = simulate(GreedyPolicy(), [trace(0, 0, 1, 1)], 0, JOB, PRICES)
    # Waiting at tick 0 leaves 3 h for 2 h + 0.5 h overhead; waiting again would not: on-demand from tick 1,
    # and it stays there even when spot comes back.
    assert [p for p, _ in r.placements] == [
        Market.NONE,
        Market.ON_DEMAND,
        Market.ON_DEMAND,
        Market.ON_DEMAND,
    ]
    assert (r.ondemand_hours, r.cost, r.finished_hours) == (2.0, 7.5, 3.5)


def test_a_preemption_costs_a_new_launch():
    r = simulate(GreedyPolicy(), [trace(1, 0, 1, 1, 1, 1)], 0, Job(2.0, 6.0, 0.5), PRICES)
    # tick 0: spot 0.5 work; tick 1: preempted, wait; tick 2: relaunch 0.5 work; tick 3: 1 h -> done.
    assert r.launches == 2 and r.spot_hours == 2.0 and r.spot_billed_hours == 3.0 and r.cost == 3.0


def test_uniform_progress_goes_on_demand_when_behind_and_back_to_spot_on_the_line():
    job = Job(hours=2.0, deadline_hours=8.0, restart_hours=0.5)  # the line: 0.25 h of work per hour
    r = simulate(UniformProgressPolicy(), [trace(0, 0, 0, 1, 1, 1, 1, 1)], 0, job, PRICES)
    kinds = [p for p, _ in r.placements]
    assert kinds[0] is Market.NONE  # on the line at t=0: wait
    assert kinds[1] is Market.ON_DEMAND  # behind at t=1: catch up
    assert Market.SPOT in kinds and not r.missed


def test_omniscient_finds_the_cheapest_mix():
    r = omniscient([trace(0, 0, 1, 1)], 0, JOB, PRICES)
    # On-demand for one tick (0.5 h work), then spot for 1.5 h of work, finishing exactly at the deadline:
    # 3 x 1 h + 1 x 2 h = 5 (on-demand to the end would be 7.5).
    assert r.cost == pytest.approx(5.0)
    assert r.ondemand_hours == pytest.approx(0.5) and r.spot_hours == pytest.approx(1.5)
    assert not r.missed


def test_omniscient_picks_the_better_pool():
    pools = [trace(1, 0, 1, 0, 1, 0), trace(1, 1, 1, 1, 1, 1)]
    r = omniscient(pools, 0, Job(3.0, 6.0, 0.5), PRICES)
    assert r.cost == pytest.approx(3.5) and r.launches == 1
    assert {p for k, p in r.placements if k is Market.SPOT} == {1}


def test_omniscient_handles_overheads_that_are_not_whole_ticks():
    t = Trace("t", 1 / 6, tuple(bool(x) for x in [1, 1, 0, 0, 1, 1, 1, 1] * 10))
    job = Job(hours=1.0, deadline_hours=2.0, restart_hours=0.2)  # 1.2 ticks of overhead
    best = omniscient([t], 0, job)
    for policy in (GreedyPolicy(), UniformProgressPolicy(), OnDemandPolicy()):
        assert simulate(policy, [t], 0, job).cost >= best.cost - 1e-9


@pytest.mark.parametrize("policy", [GreedyPolicy, UniformProgressPolicy, OnDemandPolicy])
def test_the_safety_net_never_misses_a_feasible_deadline(policy):
    rng = random.Random(7)
    for _ in range(150):
        n = 60
        p_up = rng.random()
        pools = [trace(*(rng.random() < p_up for _ in range(n))) for _ in range(rng.choice([1, 2]))]
        hours = rng.uniform(1, 20)
        restart = rng.choice([0.0, 0.2, 0.5, 1.0, 1.5])
        slack = rng.choice([0.0, 0.01, 0.5, 3.0, 15.0])
        job = Job(hours, min(hours + restart + slack, n - 1), restart)
        if job.deadline_hours < hours + restart:
            continue
        r = simulate(policy(), pools, 0, job)
        assert not r.missed, (job, pools)
        assert r.spot_hours + r.ondemand_hours == pytest.approx(hours)


def test_omniscient_is_a_lower_bound_on_random_traces():
    rng = random.Random(11)
    for _ in range(25):
        pools = [trace(*(rng.random() < 0.6 for _ in range(30))) for _ in range(rng.choice([1, 2]))]
        hours = rng.randint(4, 20) / 2  # on the bound's grid (half-hour overheads on 1 h ticks)
        job = Job(hours, hours + 0.5 + rng.uniform(0, 10), 0.5)
        best = omniscient(pools, 0, job, PRICES)
        assert not best.missed
        for policy in (GreedyPolicy(), UniformProgressPolicy(), OnDemandPolicy()):
            assert simulate(policy, pools, 0, job, PRICES).cost >= best.cost - 1e-9


def test_a_policy_that_takes_unavailable_spot_is_caught():
    class Cheater:
        name = "cheater"

        def reset(self, *_):
            pass

        def decide(self, s):
            return Choice(Market.SPOT, 0)

    with pytest.raises(RuntimeError, match="not available"):
        simulate(Cheater(), [trace(0, 0, 0, 0)], 0, JOB)


def test_infeasible_jobs_and_starts_are_refused():
    with pytest.raises(ValueError, match="cannot meet"):
        simulate(GreedyPolicy(), [trace(1, 1, 1, 1)], 0, Job(4.0, 4.0, 0.5))
    with pytest.raises(TraceError, match="past the end"):
        simulate(GreedyPolicy(), [trace(1, 1, 1, 1)], 1, JOB)
    with pytest.raises(TraceError, match="different gap"):
        simulate(GreedyPolicy(), [trace(1, 1, 1, 1), Trace("x", 0.5, (True,) * 8)], 0, JOB)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ("[1, 0]", "'data' list"),
        ('{"data": [1]}', "gap_seconds"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "gap_seconds"),
        ('{"metadata": {"gap_seconds": 600}, "data": []}', "empty"),
        ('{"metadata": {"gap_seconds": 600}, "data": [1, "x"]}', "data[1]"),
        ('{"metadata": {"gap_seconds": 600}, "data": [1, true]}', "data[1]"),
    ],
)
def test_bad_traces_get_one_line(tmp_path, content, message):
    f = tmp_path / "t.json"
    f.write_text(content)
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        load_trace(f)
    assert "\n" not in str(err.value)


def test_trace_values_above_one_count_as_available(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 2, 0.5]}))
    t = load_trace(f)
    assert t.available == (False, True, True, False) and t.gap_hours == pytest.approx(1 / 6)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.json")


class WaitFirst:
    """Waits the first `waits` ticks whatever spot does, then is greedy."""

    name = "wait-first"

    def __init__(self, waits: int) -> None:
        self.waits = waits

    def reset(self, job_hours, deadline_hours, restart_hours):
        self.greedy = GreedyPolicy()
        self.greedy.reset(job_hours, deadline_hours, restart_hours)

    def decide(self, s):
        if s.elapsed_hours < self.waits:
            return Choice(Market.NONE, None, "wait")
        return self.greedy.decide(s)


def test_time_is_judged_beside_money_idle_hours_while_spot_was_there_are_counted():
    job = Job(hours=2.0, deadline_hours=8.0, restart_hours=0.5)
    lazy = simulate(WaitFirst(2), [trace(1, 1, 1, 1, 1, 1, 1, 1)], 0, job, PRICES)
    assert lazy.idle_with_spot_hours == 2.0 and lazy.finished_hours == 4.5  # same cost, two hours later
    eager = simulate(GreedyPolicy(), [trace(1, 1, 1, 1, 1, 1, 1, 1)], 0, job, PRICES)
    assert eager.idle_with_spot_hours == 0.0 and eager.finished_hours == 2.5 and eager.cost == lazy.cost
    # waiting while no pool has spot is no idle time beside free spot
    no_spot = simulate(GreedyPolicy(), [trace(0, 0, 1, 1, 1, 1, 1, 1)], 0, job, PRICES)
    assert no_spot.idle_with_spot_hours == 0.0
    # the bound counts it the same way: spot only from tick 2 on, and the bound, for money alone, may wait
    bound = omniscient([trace(0, 1, 1, 1, 1, 1, 1, 1)], 0, job, PRICES)
    waited = sum(1 for p, _ in bound.placements if p is Market.NONE)
    assert bound.idle_with_spot_hours == waited - 1  # the first tick had no spot

"""choose_capacity for a job that already runs: what the live system asks that the simulator never does
(its measured rate of progress can change its slack while it runs)."""

from __future__ import annotations

from spotguard.domain.capacity.model import Market
from spotguard.domain.capacity.planner import JobNeeds, PoolOption, choose_capacity


def _pools() -> list[PoolOption]:
    common = {"gpus_per_instance": 1, "spot_price": 1.0, "on_demand_price": 3.0}
    return [PoolOption("a", available=True, **common), PoolOption("b", available=True, **common)]


def test_slack_below_a_restart_keeps_the_spot_instance_it_holds():
    # 4.7 h of work, 4.8 h left, a 0.2 h restart: on-demand (a restart) would miss for sure
    job = JobNeeds(
        gpus=1,
        work_left_hours=4.7,
        restart_hours=0.2,
        time_left_hours=4.8,
        placement=Market.SPOT,
        pool="a",
    )
    d = choose_capacity(job, _pools())
    assert (d.placement, d.pool) == (Market.SPOT, "a") and "holds" in d.reason


def test_slack_below_a_restart_without_an_instance_cannot_be_met():
    job = JobNeeds(gpus=1, work_left_hours=4.7, restart_hours=0.2, time_left_hours=4.8)
    d = choose_capacity(job, _pools())
    assert d.placement is Market.ON_DEMAND and "cannot be met" in d.reason


def test_past_even_the_held_instance_on_demand_finishes_soonest():
    job = JobNeeds(
        gpus=1,
        work_left_hours=5.0,
        restart_hours=0.2,
        time_left_hours=4.8,
        placement=Market.SPOT,
        pool="a",
    )
    assert "cannot be met" in choose_capacity(job, _pools()).reason

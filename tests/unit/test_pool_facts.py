"""PoolRebalanceFacts (usecases.pools): a rebalance recommendation for a host kept on the pool the host is in,
with fakes of ECS's description and of the ledger's pools; and what the interruption function's cold
start loads of the pools (nothing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.pools import HostPlacement, PoolRecord
from spotguard.domain.tasks import ContainerInstanceRef
from spotguard.usecases.pools import PoolRebalanceFacts
from tests.fakes import FakePoolStore

T0 = datetime(2026, 11, 21, 14, 46, 3, tzinfo=UTC)
REF = ContainerInstanceRef(
    cluster_arn="arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot",
    container_instance_arn="arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-spot/0123",
    instance_id="i-0b662ef9931388ba0",
)


def record(provider: str, market: str, zone: str = "us-east-1a") -> PoolRecord:
    return PoolRecord(
        cluster="gpu-spot",
        capacity_provider=provider,
        auto_scaling_group=f"{provider}-group",
        market=market,
        instance_type="g5.xlarge",
        availability_zone=zone,
        gpus_per_instance=1,
        constrain_type=False,
        constrain_zone=False,
        discovered_at=T0,
    )


class Hosts:
    def __init__(self, placement: HostPlacement | None) -> None:
        self.placement_ = placement

    def placement(self, ref):
        return self.placement_


POOLS = (
    record("gpu-spot-a", "spot"),
    record("gpu-spot-b", "spot", "us-east-1b"),
    record("gpu-od", "on-demand"),
)
# a host that ECS says is in gpu-spot-a's g5.xlarge in us-east-1a
IN_SPOT_A = HostPlacement(
    cluster="gpu-spot",
    capacity_provider="gpu-spot-a",
    instance_type="g5.xlarge",
    availability_zone="us-east-1a",
)


def test_ecs_names_the_provider_the_pool_is_read_and_written_by_name():
    ledger = FakePoolStore(*POOLS)
    where = IN_SPOT_A
    facts = PoolRebalanceFacts(Hosts(where), ledger)
    assert facts.record_rebalance(REF, REF.instance_id, T0) == ["gpu-spot-a/g5.xlarge/us-east-1a"]
    assert facts.record_rebalance(REF, REF.instance_id, T0) == ["gpu-spot-a/g5.xlarge/us-east-1a"]
    assert ledger.calls == ["record gpu-spot-a/g5.xlarge/us-east-1a"] * 2  # no Query
    pool = ledger.by_name["gpu-spot-a/g5.xlarge/us-east-1a"]
    assert pool.rebalances.value == 1.0 and len(pool.observations) == 1  # the redelivery counted once
    assert pool.unavailable_until is None
    assert all(not p.observations for n, p in ledger.by_name.items() if n != pool.name)


def test_without_a_provider_the_one_spot_pool_of_the_type_and_zone():
    ledger = FakePoolStore(*POOLS)
    where = HostPlacement(cluster="gpu-spot", instance_type="g5.xlarge", availability_zone="us-east-1a")
    assert PoolRebalanceFacts(Hosts(where), ledger).record_rebalance(REF, REF.instance_id, T0) == [
        "gpu-spot-a/g5.xlarge/us-east-1a"
    ]
    assert ledger.calls == ["query", "record gpu-spot-a/g5.xlarge/us-east-1a"]


def test_a_host_in_no_pool_keeps_no_fact():
    for where in (
        None,  # ECS no longer describes it
        HostPlacement(
            cluster="gpu-spot",
            capacity_provider="cpu",
            instance_type="m7i.large",
            availability_zone="us-east-1a",
        ),
        HostPlacement(cluster="gpu-spot", instance_type="g6.xlarge", availability_zone="us-east-1a"),
    ):
        ledger = FakePoolStore(*POOLS)
        assert PoolRebalanceFacts(Hosts(where), ledger).record_rebalance(REF, REF.instance_id, T0) == []
        assert all(not p.observations for p in ledger.by_name.values())


@pytest.mark.parametrize("ahead", [timedelta(days=1), timedelta(days=365 * 4)])
def test_a_rebalance_dated_ahead_of_the_clock_is_kept_on_no_pool(ahead):
    """Kept, a rebalance dated 2030 would leave the pool's rebalance count undecayed until then; the
    time bound of Auto Scaling's events holds for it too."""
    ledger = FakePoolStore(*POOLS)
    where = IN_SPOT_A
    facts = PoolRebalanceFacts(Hosts(where), ledger, clock=lambda: T0)
    assert facts.record_rebalance(REF, REF.instance_id, T0 + ahead) == []
    assert all(not p.observations for p in ledger.pools("gpu-spot"))
    assert facts.record_rebalance(REF, REF.instance_id, T0 + timedelta(minutes=1)) == [  # clock skew: kept
        "gpu-spot-a/g5.xlarge/us-east-1a"
    ]

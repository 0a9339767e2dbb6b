"""Pools (domain.pools): discovery from API-shaped answers, folding facts, the history they make, and the
planner's options."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spotguard.domain.capacity.planner import JobNeeds, choose_capacity
from spotguard.domain.pools import (
    BACKOFF_MAX,
    MAX_OBSERVATIONS,
    ClusterDescription,
    HostPlacement,
    Observation,
    PoolRecord,
    ScoreQuote,
    SpotQuote,
    availability_history,
    backoff_length,
    discover_pools,
    fold,
    fold_all,
    group_market,
    host_pools,
    mark_gone,
    matching_pools,
    merge_discovered,
    on_demand_pool,
    pool_options,
    price_override,
    rebalance_fact,
    with_score,
    with_spot_price,
)
from spotguard.domain.prices import ON_DEMAND_PRICES, UNPRICED_PER_GPU

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
ACCOUNT = "123456789012"


def asg_arn(name: str) -> str:
    group_id = "5f3c2e1a-0000-4000-8000-000000000000"
    return f"arn:aws:autoscaling:us-east-1:{ACCOUNT}:autoScalingGroup:{group_id}:autoScalingGroupName/{name}"


def provider(name: str, group: str, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """DescribeCapacityProviders' shape (include=["TAGS"])."""
    return {
        "capacityProviderArn": f"arn:aws:ecs:us-east-1:{ACCOUNT}:capacity-provider/{name}",
        "name": name,
        "status": "ACTIVE",
        "autoScalingGroupProvider": {
            "autoScalingGroupArn": asg_arn(group),
            "managedScaling": {"status": "ENABLED", "targetCapacity": 100},
            "managedTerminationProtection": "ENABLED",
            "managedDraining": "DISABLED",
        },
        "updateStatus": "UPDATE_COMPLETE",
        "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
    }


def mixed_group(name: str, types: list[str], subnets: list[str], on_demand_percent: int) -> dict[str, Any]:
    """DescribeAutoScalingGroups' shape of examples/gpu-cluster's groups."""
    return {
        "AutoScalingGroupName": name,
        "AutoScalingGroupARN": asg_arn(name),
        "MixedInstancesPolicy": {
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {
                    "LaunchTemplateId": "lt-0gpu",
                    "LaunchTemplateName": "gpu",
                    "Version": "3",
                },
                "Overrides": [{"InstanceType": t} for t in types],
            },
            "InstancesDistribution": {
                "OnDemandAllocationStrategy": "prioritized",
                "OnDemandBaseCapacity": 0,
                "OnDemandPercentageAboveBaseCapacity": on_demand_percent,
                "SpotAllocationStrategy": "price-capacity-optimized",
            },
        },
        "MinSize": 0,
        "MaxSize": 8,
        "DesiredCapacity": 0,
        "AvailabilityZones": ["us-east-1a", "us-east-1b"],
        "VPCZoneIdentifier": ",".join(subnets),
        "CapacityRebalance": on_demand_percent == 0,
        "Tags": [],
    }


def template_group(name: str, template: str, subnet: str) -> dict[str, Any]:
    return {
        "AutoScalingGroupName": name,
        "AutoScalingGroupARN": asg_arn(name),
        "LaunchTemplate": {
            "LaunchTemplateId": template,
            "LaunchTemplateName": "spot-t4",
            "Version": "$Latest",
        },
        "MinSize": 0,
        "MaxSize": 2,
        "AvailabilityZones": ["us-east-1a"],
        "VPCZoneIdentifier": subnet,
    }


TEMPLATES = [
    {
        "LaunchTemplateId": "lt-0t4",
        "LaunchTemplateName": "spot-t4",
        "VersionNumber": 2,
        "DefaultVersion": False,
        "LaunchTemplateData": {
            "InstanceType": "g4dn.xlarge",
            "InstanceMarketOptions": {"MarketType": "spot"},
        },
    }
]
SUBNETS = [
    {
        "SubnetId": "subnet-a",
        "AvailabilityZone": "us-east-1a",
        "AvailabilityZoneId": "use1-az4",
        "VpcId": "vpc-1",
    },
    {
        "SubnetId": "subnet-b",
        "AvailabilityZone": "us-east-1b",
        "AvailabilityZoneId": "use1-az6",
        "VpcId": "vpc-1",
    },
]


def gpu_type(name: str, gpus: int) -> dict[str, Any]:
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": 4},
        "GpuInfo": {
            "Gpus": [
                {"Name": "A10G", "Manufacturer": "NVIDIA", "Count": gpus, "MemoryInfo": {"SizeInMiB": 22888}}
            ]
        },
    }


def described(**changes: Any) -> ClusterDescription:
    data: dict[str, Any] = {
        "cluster": "gpu-spot",
        "capacity_providers": [
            provider("gpu-spot-gpu1-spot", "gpu1-spot"),
            provider("gpu-spot-gpu1-ondemand", "gpu1-ondemand"),
            provider("gpu-spot-t4", "t4-spot"),
            provider("gpu-spot-cpu", "cpu", {"spotguard:pool": "ignore"}),
            provider("FARGATE", "none"),
        ],
        "auto_scaling_groups": [
            mixed_group("gpu1-spot", ["g5.xlarge", "g6.xlarge"], ["subnet-a", "subnet-b"], 0),
            mixed_group("gpu1-ondemand", ["g5.xlarge"], ["subnet-a", "subnet-b"], 100),
            template_group("t4-spot", "lt-0t4", "subnet-a"),
            mixed_group("cpu", ["m7i.large"], ["subnet-a"], 0),
        ],
        "launch_templates": TEMPLATES,
        "subnets": SUBNETS,
        "instance_types": [gpu_type("g5.xlarge", 1), gpu_type("g6.xlarge", 1), gpu_type("g4dn.xlarge", 1)],
    }
    data.update(changes)
    return ClusterDescription.model_validate(data)


def names(pools: Any) -> list[str]:
    return sorted(p.name for p in pools)


# ================================================================================== discovery
def test_a_mixed_spot_group_over_two_types_and_two_zones_is_four_constrained_pools():
    found = discover_pools(described(), NOW)
    spot = [p for p in found.pools if p.capacity_provider == "gpu-spot-gpu1-spot"]
    assert names(spot) == [
        "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a",
        "gpu-spot-gpu1-spot/g5.xlarge/us-east-1b",
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1a",
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1b",
    ]
    for p in spot:
        assert p.market == "spot" and p.constrain_type and p.constrain_zone
        assert p.auto_scaling_group == "gpu1-spot" and p.gpus_per_instance == 1
        assert p.group_instance_types == ("g5.xlarge", "g6.xlarge")
        assert p.on_demand_price == ON_DEMAND_PRICES[p.instance_type] and p.on_demand_price_source == "table"
        assert p.key == ("pool#gpu-spot", p.name)
    zones = {p.availability_zone: p.availability_zone_id for p in spot}
    assert zones == {"us-east-1a": "use1-az4", "us-east-1b": "use1-az6"}


def test_a_single_type_single_zone_group_is_one_pool_without_constraints_and_its_market_from_the_template():
    found = discover_pools(described(), NOW)
    [t4] = [p for p in found.pools if p.capacity_provider == "gpu-spot-t4"]
    assert t4.name == "gpu-spot-t4/g4dn.xlarge/us-east-1a"
    assert t4.market == "spot"  # the launch template's InstanceMarketOptions
    assert not t4.constrain_type and not t4.constrain_zone


def test_the_on_demand_group_the_ignored_provider_and_fargate():
    found = discover_pools(described(), NOW)
    on_demand = [p for p in found.pools if p.capacity_provider == "gpu-spot-gpu1-ondemand"]
    assert {p.market for p in on_demand} == {"on-demand"} and len(on_demand) == 2
    assert all(not p.constrain_type and p.constrain_zone for p in on_demand)
    assert not [p for p in found.pools if p.capacity_provider in ("gpu-spot-cpu", "FARGATE")]
    assert [(s.capacity_provider, s.reason) for s in found.skipped] == [
        ("gpu-spot-cpu", "tagged spotguard:pool=ignore")
    ]
    assert found.complete and len(found.pools) == 7


def test_market_of_a_mixed_distribution_is_on_demand():
    group = described().auto_scaling_groups[0]
    assert group_market(group, None) == "spot"
    half = group.model_copy(
        update={
            "mixed": group.mixed.model_copy(
                update={"distribution": group.mixed.distribution.model_copy(update={"on_demand_percent": 50})}
            )
        }
    )
    assert group_market(half, None) == "on-demand"
    base = group.mixed.distribution.model_copy(update={"on_demand_base": 1})
    assert (
        group_market(
            group.model_copy(update={"mixed": group.mixed.model_copy(update={"distribution": base})}), None
        )
        == "on-demand"
    )


def test_the_price_tag_overrides_the_table_for_all_types_or_per_type():
    one = described(capacity_providers=[provider("p", "gpu1-spot", {"spotguard:on-demand-price": "1.5"})])
    assert {p.on_demand_price for p in discover_pools(one, NOW).pools} == {1.5}
    per_type = described(
        capacity_providers=[provider("p", "gpu1-spot", {"spotguard:on-demand-price": "g6.xlarge=0.9"})]
    )
    prices = {
        (p.instance_type, p.on_demand_price, p.on_demand_price_source)
        for p in discover_pools(per_type, NOW).pools
    }
    assert prices == {("g6.xlarge", 0.9, "tag"), ("g5.xlarge", ON_DEMAND_PRICES["g5.xlarge"], "table")}
    bad = described(capacity_providers=[provider("p", "gpu1-spot", {"spotguard:on-demand-price": "cheap"})])
    assert {p.on_demand_price_source for p in discover_pools(bad, NOW).pools} == {"table"}
    with pytest.raises(ValueError):
        price_override("-1", "g5.xlarge")
    assert price_override("g5.xlarge=1.0", "g6.xlarge") is None


def test_an_unknown_type_is_a_pool_without_a_price_and_costlier_on_demand_than_priced_ones():
    data = described(
        capacity_providers=[provider("new", "new-spot"), provider("old", "gpu1-spot")],
        auto_scaling_groups=[
            mixed_group("new-spot", ["g7.xlarge"], ["subnet-a"], 0),
            mixed_group("gpu1-spot", ["g5.xlarge"], ["subnet-a"], 0),
        ],
        instance_types=[gpu_type("g7.xlarge", 1), gpu_type("g5.xlarge", 1)],
    )
    pools = discover_pools(data, NOW).pools
    [new] = [p for p in pools if p.instance_type == "g7.xlarge"]
    assert new.on_demand_price is None and new.on_demand_price_source is None and new.gpus_per_instance == 1
    priced = [with_spot_price(p, quote(p, 0.4)) for p in pools]
    options = {o.name: o for o in pool_options(priced, NOW, 1 / 6)}
    assert options[new.name].on_demand_price == UNPRICED_PER_GPU
    assert options[new.name].on_demand_price > options["old/g5.xlarge/us-east-1a"].on_demand_price
    decision = choose_capacity(
        JobNeeds(gpus=1, work_left_hours=2, restart_hours=0.1, time_left_hours=None, waited_hours=5),
        list(options.values()),
    )
    assert decision.instance_pool  # the policy runs with the penalty price


def test_groups_whose_types_cannot_be_known_are_skipped_with_a_reason():
    attrs = mixed_group("attrs", [], ["subnet-a"], 0)
    attrs["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"] = [
        {"InstanceRequirements": {"VCpuCount": {"Min": 4}}}
    ]
    legacy = {
        "AutoScalingGroupName": "legacy",
        "LaunchConfigurationName": "lc",
        "VPCZoneIdentifier": "subnet-a",
    }
    data = described(
        capacity_providers=[provider("a", "attrs"), provider("b", "legacy"), provider("c", "nowhere")],
        auto_scaling_groups=[attrs, legacy],
    )
    found = discover_pools(data, NOW)
    assert found.pools == ()
    reasons = {s.capacity_provider: s.reason for s in found.skipped}
    assert (
        "by attributes" in reasons["a"]
        and "launch configuration" in reasons["b"]
        and "not found" in reasons["c"]
    )


def test_a_mixed_group_without_overrides_takes_its_templates_type_and_failures_make_discovery_incomplete():
    group = mixed_group("g", [], ["subnet-a", "subnet-z"], 0)
    group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"] = []
    group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"] = {
        "LaunchTemplateId": "lt-0t4",
        "Version": "2",
    }
    data = described(capacity_providers=[provider("p", "g")], auto_scaling_groups=[group])
    found = discover_pools(data, NOW)
    assert names(found.pools) == ["p/g4dn.xlarge/us-east-1a"]
    assert found.pools[0].market == "spot" and not found.complete  # subnet-z was not described
    assert not discover_pools(described(failures=["capacity provider x: MISSING"]), NOW).complete


# ====================================================================================== facts
def pool(**changes: Any) -> PoolRecord:
    base = next(p for p in discover_pools(described(), NOW).pools if p.market == "spot")
    return base.model_copy(update=changes)


def fact(minutes: float, available: bool, source: str = "launch", detail: str = "") -> Observation:
    return Observation(at=NOW + timedelta(minutes=minutes), available=available, source=source, detail=detail)


def quote(p: PoolRecord, price: float | None, at: datetime = NOW) -> SpotQuote:
    return SpotQuote(instance_type=p.instance_type, availability_zone=p.availability_zone, price=price, at=at)


def test_folding_the_same_fact_twice_changes_nothing():
    failure = fact(0, False, "launch-failure", "We currently do not have sufficient g5.xlarge capacity")
    once = fold(pool(), failure)
    assert fold(once, failure) is once
    assert once.launch_failures.value == 1.0 and once.unavailable_until == NOW + timedelta(minutes=15)
    assert not once.available_at(NOW + timedelta(minutes=10)) and once.available_at(
        NOW + timedelta(minutes=15)
    )
    # the same facts in another order make the same pool
    facts = [
        fact(0, True, "run"),
        failure,
        fact(30, False, "interruption", "i-1"),
        fact(40, True, "rebalance"),
    ]
    assert fold_all(pool(), facts) == fold_all(pool(), reversed(facts)) == fold_all(pool(), facts + facts)


def test_a_repeated_failure_doubles_the_backoff_up_to_an_hour_and_a_launch_ends_it():
    p = pool()
    lengths = []
    at = 0.0
    for _ in range(5):
        p = fold(p, fact(at, False, "launch-failure"))
        lengths.append(p.unavailable_until - (NOW + timedelta(minutes=at)))
        at = (p.unavailable_until - NOW).total_seconds() / 60 + 1  # tried again just after the backoff
    assert [int(x.total_seconds() // 60) for x in lengths] == [15, 30, 60, 60, 60]
    assert p.backoff_streak == 5
    # a failure inside the backoff extends it to its own time plus the current length, no doubling
    inside = fold(pool(), fact(0, False, "launch-failure"))
    inside = fold(inside, fact(5, False, "provisioning-timeout"))
    assert inside.unavailable_until == NOW + timedelta(minutes=20) and inside.backoff_streak == 1
    # a launch in the pool ends it; a task running there does not
    assert fold(inside, fact(6, True, "run")).unavailable_until == inside.unavailable_until
    launched = fold(inside, fact(6, True, "launch"))
    assert launched.unavailable_until is None and launched.backoff_streak == 0
    # a failure long after the last backoff starts again at 15 minutes
    later = fold(p, fact(at + 60 * 5, False, "launch-failure"))
    assert later.backoff_streak == 1 and backoff_length(later.backoff_streak) == timedelta(minutes=15)
    assert backoff_length(10) == BACKOFF_MAX


def test_observations_are_bounded_and_an_older_fact_than_all_kept_is_ignored_once_full():
    p = fold_all(pool(), (fact(i, True, "run", f"task {i}") for i in range(MAX_OBSERVATIONS + 10)))
    assert len(p.observations) == MAX_OBSERVATIONS and p.observations[0].detail == "task 10"
    assert fold(p, fact(0, False, "interruption")) is p
    assert len(fact(0, True, detail="x" * 1000).detail) == 160


def test_counts_decay_and_prices_and_scores_only_move_forward():
    p = fold_all(pool(), [fact(0, True, "rebalance", "i-1"), fact(0, True, "rebalance", "i-2")])
    assert p.rebalances.value_at(NOW) == pytest.approx(2.0)
    assert p.rebalances.value_at(NOW + timedelta(hours=24)) == pytest.approx(1.0)
    priced = with_spot_price(p, quote(p, 0.4))
    assert priced.spot_price == 0.4 and priced.spot_priced_at == NOW
    assert with_spot_price(priced, quote(p, 0.9, NOW - timedelta(hours=1))) is priced
    other = SpotQuote(
        instance_type="g6.xlarge", availability_zone="us-east-1b", price=0.1, at=NOW + timedelta(hours=1)
    )
    assert with_spot_price(priced, other) is priced
    s = ScoreQuote(
        capacity_provider=p.capacity_provider, availability_zone_id=p.availability_zone_id, score=7, at=NOW
    )
    assert with_score(p, s).placement_score == 7
    assert with_score(p, s.model_copy(update={"availability_zone_id": "use1-az1"})) is p


def test_a_pool_found_again_keeps_its_facts_and_newer_readings():
    stored = with_spot_price(fold(pool(), fact(0, False, "interruption")), quote(pool(), 0.5))
    found = pool(discovered_at=NOW + timedelta(days=1), on_demand_price=2.0)
    merged = merge_discovered(mark_gone(stored, NOW), found)
    assert merged.observations == stored.observations and merged.spot_price == 0.5
    assert merged.on_demand_price == 2.0 and merged.gone_since is None and merged.discovered_at == NOW
    fresher = with_spot_price(found, quote(found, 0.3, NOW + timedelta(hours=2)))
    assert merge_discovered(stored, fresher).spot_price == 0.3


# ==================================================================================== history
TICK = 1 / 6  # hours


def ticks_of(p: PoolRecord, now: datetime, hold_hours: float = 2.0) -> tuple[list[float], int | None, int]:
    h = availability_history(p, TICK, now, half_life_hours=10_000.0, hold_hours=hold_hours)
    return [float(h.exposure[0].sum()), float(h.exposure[1].sum())], h.state, h.age


def test_facts_hold_until_the_next_fact_as_ticks():
    # available at 0, unavailable at 30 min, available at 60 min; now is 85 min: ticks 0-2 up, 3-5 down,
    # 6-8 up (the tick of now included)
    p = fold_all(pool(), [fact(0, True, "launch"), fact(30, False, "interruption"), fact(60, True, "launch")])
    (down, up), state, age = ticks_of(p, NOW + timedelta(minutes=85))
    assert (down, up) == pytest.approx((3.0, 6.0), rel=1e-3)
    assert state == 1 and age == 3


def test_a_fact_holds_at_most_hold_hours_then_the_state_is_unknown():
    p = fold(pool(), fact(0, True, "launch"))
    (down, up), state, age = ticks_of(p, NOW + timedelta(hours=5), hold_hours=1.0)
    assert (down, up) == pytest.approx((0.0, 6.0), rel=1e-3)
    assert state is None and age == 0  # a gap: the run's age is not known
    # a fact after the gap starts a new run
    p = fold(p, fact(4 * 60, False, "launch-failure"))
    (down, up), state, age = ticks_of(p, NOW + timedelta(hours=4, minutes=25), hold_hours=1.0)
    assert (down, up) == pytest.approx((3.0, 6.0), rel=1e-3) and state == 0 and age == 3
    # the run before the gap did not "end" (no transition is counted across a gap)
    h = availability_history(
        p, TICK, NOW + timedelta(hours=4, minutes=25), half_life_hours=10_000.0, hold_hours=1.0
    )
    assert h.ends.sum() == 0


def test_the_last_fact_in_a_tick_counts_and_future_facts_are_left_out():
    p = fold_all(pool(), [fact(0, True, "launch"), fact(5, False, "interruption"), fact(90, True, "launch")])
    (down, up), state, _ = ticks_of(p, NOW + timedelta(minutes=15))
    assert (down, up) == pytest.approx((2.0, 0.0), rel=1e-3) and state == 0
    assert availability_history(pool(), TICK, NOW).state is None  # no facts: the prior alone


def test_unobserved_stretches_age_the_counts():
    p = fold_all(pool(), [fact(0, False, "interruption"), fact(10, True, "launch")])
    held = availability_history(p, TICK, NOW + timedelta(hours=2), half_life_hours=1.0)  # the last fact holds
    far = availability_history(p, TICK, NOW + timedelta(hours=10), half_life_hours=1.0)  # 8 h unobserved
    assert far.exposure.sum() == pytest.approx(held.exposure.sum() * 0.5**8, rel=0.05)


# ==================================================================================== options
def test_options_are_the_spot_pools_with_their_prices_history_and_availability():
    pools = list(discover_pools(described(), NOW).pools)
    g5a = next(p for p in pools if p.name == "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a")
    pools = [
        with_spot_price(p, quote(p, 0.35)) if p.market == "spot" and p.name != g5a.name else p for p in pools
    ]
    backed_off = next(p for p in pools if p.name == "gpu-spot-gpu1-spot/g6.xlarge/us-east-1a")
    pools = [fold(p, fact(-5, False, "launch-failure")) if p is backed_off else p for p in pools]
    gone = next(p for p in pools if p.name == "gpu-spot-gpu1-spot/g6.xlarge/us-east-1b")
    pools = [mark_gone(p, NOW) if p is gone else p for p in pools]
    options = {o.name: o for o in pool_options(pools, NOW, TICK)}
    assert sorted(options) == [
        "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a",
        "gpu-spot-gpu1-spot/g5.xlarge/us-east-1b",
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1a",
        "gpu-spot-t4/g4dn.xlarge/us-east-1a",
    ]
    assert not options[g5a.name].available  # no spot price yet
    assert not options[backed_off.name].available and options[backed_off.name].history is not None
    ready = options["gpu-spot-gpu1-spot/g5.xlarge/us-east-1b"]
    assert ready.available and ready.spot_price == 0.35 and ready.history is None
    assert ready.on_demand_price == ON_DEMAND_PRICES["g5.xlarge"]
    assert options[backed_off.name].available is False
    later = {o.name: o for o in pool_options(pools, NOW + timedelta(minutes=11), TICK)}
    assert later[backed_off.name].available
    decision = choose_capacity(
        JobNeeds(gpus=1, work_left_hours=2, restart_hours=0.1, time_left_hours=None), list(options.values())
    )
    assert decision.pool in {n for n, o in options.items() if o.available}
    # on-demand in the decision's type goes to the on-demand group's pool of that type
    od = on_demand_pool(pools, "g5.xlarge", NOW, zone="us-east-1b")
    assert od is not None and od.name == "gpu-spot-gpu1-ondemand/g5.xlarge/us-east-1b"
    assert on_demand_pool(pools, "g6.xlarge", NOW) is None


def test_matching_pools_of_a_group_event():
    pools = discover_pools(described(), NOW).pools
    assert names(matching_pools(pools, "gpu1-spot", "us-east-1a")) == [
        "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a",
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1a",
    ]
    assert len(matching_pools(pools, "gpu1-spot")) == 4
    assert names(matching_pools(pools, "gpu1-spot", "us-east-1b", "g6.xlarge")) == [
        "gpu-spot-gpu1-spot/g6.xlarge/us-east-1b"
    ]


# ================================================================================= rebalances
def test_a_rebalance_recommendation_is_counted_once_and_is_no_fact_about_capacity():
    once = fold(pool(), rebalance_fact(NOW, "i-0b662ef9931388ba0"))
    assert fold(once, rebalance_fact(NOW, "i-0b662ef9931388ba0")) is once  # the notice delivered again
    assert once.rebalances.value == 1.0 and once.interruptions.value == 0.0
    (kept,) = once.observations
    assert (kept.source, kept.available, kept.detail) == ("rebalance", True, "i-0b662ef9931388ba0")
    # a risk signal, not a lost instance: no backoff, and the pool is still offered as available
    assert once.unavailable_until is None and once.backoff_streak == 0 and once.available_at(NOW)
    (option,) = [o for o in pool_options([once.model_copy(update={"spot_price": 0.4})], NOW, TICK)]
    assert option.available and option.history is None  # no capacity fact: the planner's prior stands
    # ... nor evidence that a shortage ended: after an expired backoff the pool stays unconfirmed
    failed = fold(pool(), fact(0, False, "launch-failure"))
    later = fold(failed, rebalance_fact(NOW + timedelta(minutes=20), "i-1"))
    assert later.available_at(NOW + timedelta(minutes=20)) and not later.confirmed_at(
        NOW + timedelta(minutes=20)
    )
    launched = fold(pool(), fact(0, True, "launch"))
    assert fold(launched, rebalance_fact(NOW + timedelta(minutes=5), "i-1")).confirmed_at(NOW)
    # ... nor an observation in the planner's history: the same history with or without it
    facts = [fact(0, True, "launch"), fact(30, False, "interruption")]
    with_risk = fold_all(pool(), [*facts, rebalance_fact(NOW + timedelta(minutes=35), "i-1")])
    now = NOW + timedelta(minutes=50)
    assert ticks_of(with_risk, now) == ticks_of(fold_all(pool(), facts), now)


def test_the_pool_a_host_is_in():
    pools = discover_pools(described(), NOW).pools

    def where(**kw: Any) -> list[str]:
        return names(host_pools(pools, HostPlacement(cluster="gpu-spot", **kw)))

    # ECS names the capacity provider: that provider's pool of the type and zone, spot or not
    assert where(
        capacity_provider="gpu-spot-gpu1-spot", instance_type="g6.xlarge", availability_zone="us-east-1b"
    ) == ["gpu-spot-gpu1-spot/g6.xlarge/us-east-1b"]
    assert where(
        capacity_provider="gpu-spot-gpu1-ondemand", instance_type="g5.xlarge", availability_zone="us-east-1a"
    ) == ["gpu-spot-gpu1-ondemand/g5.xlarge/us-east-1a"]
    assert (
        where(capacity_provider="gpu-spot-cpu", instance_type="m7i.large", availability_zone="us-east-1a")
        == []
    )
    # it names none: the one spot pool of the type and zone (the on-demand one of g5.xlarge is no match)
    assert where(instance_type="g5.xlarge", availability_zone="us-east-1a") == [
        "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a"
    ]
    assert where(instance_type="g5.xlarge") == [] and where(availability_zone="us-east-1a") == []
    assert where(instance_type="p5.48xlarge", availability_zone="us-east-1a") == []
    assert (
        names(
            host_pools(
                pools,
                HostPlacement(cluster="other", instance_type="g5.xlarge", availability_zone="us-east-1a"),
            )
        )
        == []
    )
    # two spot providers with the type in the zone cannot be told apart: no pool rather than a wrong one
    twin = next(p for p in pools if p.name == "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a").model_copy(
        update={"capacity_provider": "gpu-spot-gpu1-spot-2", "auto_scaling_group": "gpu1-spot-2"}
    )
    assert (
        names(
            host_pools(
                [*pools, twin],
                HostPlacement(cluster="gpu-spot", instance_type="g5.xlarge", availability_zone="us-east-1a"),
            )
        )
        == []
    )

"""Pools against moto (in-process, us-east-1): discovery from a real-shaped cluster (a VPC with subnets in
two zones, a launch template, a spot and an on-demand Auto Scaling group, their ECS capacity providers),
spot prices, the ledger round trip, and PoolService.refresh.

What moto lacks, and how it is covered instead:
- GetSpotPlacementScores is not in moto: the request is checked with botocore's Stubber (and an error
  means no score); for refresh, a `before-call` hook answers it after botocore validated the request.
- moto's spot prices are static placeholders (0.00001 with a 2006 timestamp): only that they are read.
- moto's DescribeCapacityProviders fails without names (the adapter always names them) and answers
  FARGATE as a MISSING failure (the adapter never asks for FARGATE or FARGATE_SPOT).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from spotguard.adapters import clients
from spotguard.adapters.pool_store import GONE_RETENTION_DAYS, DynamoPoolStore
from spotguard.adapters.pools import PoolDiscovery
from spotguard.domain.pools import Observation, ScoreQuote, SpotQuote, pool_options
from spotguard.usecases.pools import PoolService, PoolSettings
from spotguard_cli.emulator import template

REGION = "us-east-1"
CLUSTER = "gpu-spot"
TABLE = "spotguard-ledger"
NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)


def make_ledger(ddb: Any) -> None:
    """The ledger table as template.yaml declares it (keys, index, billing)."""
    props = template.load()["Resources"]["LedgerTable"]["Properties"]
    ddb.create_table(
        TableName=TABLE,
        AttributeDefinitions=props["AttributeDefinitions"],
        KeySchema=props["KeySchema"],
        GlobalSecondaryIndexes=props["GlobalSecondaryIndexes"],
        BillingMode=props["BillingMode"],
    )


def make_cluster(ec2: Any, asg: Any, ecs: Any, spot_types: list[str]) -> dict[str, str]:
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    a = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    b = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.2.0/24", AvailabilityZone="us-east-1b")["Subnet"]
    subnets = f"{a['SubnetId']},{b['SubnetId']}"
    lt = ec2.create_launch_template(
        LaunchTemplateName="gpu", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    spec = {"LaunchTemplateId": lt, "Version": "$Latest"}

    def group(name: str, types: list[str], on_demand_percent: int) -> str:
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name,
            MinSize=0,
            MaxSize=4,
            VPCZoneIdentifier=subnets,
            MixedInstancesPolicy={
                "InstancesDistribution": {
                    "OnDemandBaseCapacity": 0,
                    "OnDemandPercentageAboveBaseCapacity": on_demand_percent,
                    "SpotAllocationStrategy": "price-capacity-optimized",
                },
                "LaunchTemplate": {
                    "LaunchTemplateSpecification": spec,
                    "Overrides": [{"InstanceType": t} for t in types],
                },
            },
        )
        return asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0][
            "AutoScalingGroupARN"
        ]

    arns = {
        "gpu1-spot": group("gpu1-spot", spot_types, 0),
        "gpu1-ondemand": group("gpu1-ondemand", ["g5.xlarge"], 100),
        "gpu1-test": group("gpu1-test", ["g5.xlarge"], 0),
    }
    for name, arn in arns.items():
        tags = [{"key": "spotguard:pool", "value": "ignore"}] if name == "gpu1-test" else []
        ecs.create_capacity_provider(
            name=f"{CLUSTER}-{name}", autoScalingGroupProvider={"autoScalingGroupArn": arn}, tags=tags
        )
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.put_cluster_capacity_providers(
        cluster=CLUSTER,
        capacityProviders=[f"{CLUSTER}-{n}" for n in arns] + ["FARGATE", "FARGATE_SPOT"],
        defaultCapacityProviderStrategy=[],
    )
    return {"a": a["AvailabilityZoneId"], "b": b["AvailabilityZoneId"]}


@pytest.fixture
def world(aws):
    ec2 = clients.client("ec2", REGION)
    asg = clients.client("autoscaling", REGION)
    ecs = clients.client("ecs", REGION)
    ddb = clients.client("dynamodb", REGION)
    make_ledger(ddb)
    return {"ec2": ec2, "asg": asg, "ecs": ecs, "ddb": ddb}


SPOT = [
    "gpu-spot-gpu1-spot/g5.2xlarge/us-east-1a",
    "gpu-spot-gpu1-spot/g5.2xlarge/us-east-1b",
    "gpu-spot-gpu1-spot/g5.xlarge/us-east-1a",
    "gpu-spot-gpu1-spot/g5.xlarge/us-east-1b",
]
ON_DEMAND = ["gpu-spot-gpu1-ondemand/g5.xlarge/us-east-1a", "gpu-spot-gpu1-ondemand/g5.xlarge/us-east-1b"]


def test_discovery_finds_the_pools_their_gpus_and_spot_prices(world):
    zone_ids = make_cluster(world["ec2"], world["asg"], world["ecs"], ["g5.xlarge", "g5.2xlarge"])
    finder = PoolDiscovery(world["ecs"], world["asg"], world["ec2"])
    found = finder.discover(CLUSTER, NOW)
    assert found.complete
    assert sorted(p.name for p in found.pools) == sorted(SPOT + ON_DEMAND)
    assert [(s.capacity_provider, s.reason) for s in found.skipped] == [
        ("gpu-spot-gpu1-test", "tagged spotguard:pool=ignore")
    ]
    by_name = {p.name: p for p in found.pools}
    for name in SPOT:
        p = by_name[name]
        assert (
            p.market == "spot"
            and p.constrain_type
            and p.constrain_zone
            and p.auto_scaling_group == "gpu1-spot"
        )
        assert p.gpus_per_instance == 1  # moto's DescribeInstanceTypes GpuInfo (A10G)
        assert p.availability_zone_id == zone_ids[p.availability_zone[-1]]
        assert p.on_demand_price and p.on_demand_price_source == "table"
    for name in ON_DEMAND:
        assert by_name[name].market == "on-demand" and not by_name[name].constrain_type
    # An ARN names the cluster as well as its name does.
    arn = world["ecs"].describe_clusters(clusters=[CLUSTER])["clusters"][0]["clusterArn"]
    assert sorted(p.name for p in finder.discover(arn, NOW).pools) == sorted(SPOT + ON_DEMAND)
    assert finder.discover("no-such-cluster", NOW).pools == ()

    quotes = finder.spot_prices({"g5.xlarge", "g5.2xlarge"}, {"us-east-1a", "us-east-1b"}, NOW)
    assert sorted((q.instance_type, q.availability_zone) for q in quotes) == [
        ("g5.2xlarge", "us-east-1a"),
        ("g5.2xlarge", "us-east-1b"),
        ("g5.xlarge", "us-east-1a"),
        ("g5.xlarge", "us-east-1b"),
    ]
    assert all(
        q.price is not None and q.at == NOW and q.since is not None for q in quotes
    )  # moto: placeholders


def test_a_group_on_a_spot_launch_template_is_one_spot_pool(world):
    ec2, asg, ecs = world["ec2"], world["asg"], world["ecs"]
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.1.0/24", AvailabilityZone="us-east-1c")["Subnet"]
    ec2.create_launch_template(
        LaunchTemplateName="spot-t4",
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "InstanceType": "g4dn.xlarge",
            "InstanceMarketOptions": {"MarketType": "spot"},
        },
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName="t4",
        MinSize=0,
        MaxSize=1,
        VPCZoneIdentifier=subnet["SubnetId"],
        LaunchTemplate={"LaunchTemplateName": "spot-t4", "Version": "$Default"},
    )
    arn = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["t4"])["AutoScalingGroups"][0][
        "AutoScalingGroupARN"
    ]
    ecs.create_capacity_provider(name="t4", autoScalingGroupProvider={"autoScalingGroupArn": arn})
    ecs.create_cluster(clusterName="small")
    ecs.put_cluster_capacity_providers(
        cluster="small", capacityProviders=["t4"], defaultCapacityProviderStrategy=[]
    )
    [pool] = PoolDiscovery(ecs, asg, ec2).discover("small", NOW).pools
    assert pool.name == "t4/g4dn.xlarge/us-east-1c" and pool.market == "spot"
    assert not pool.constrain_type and not pool.constrain_zone and pool.gpus_per_instance == 1

    # a template deleted under its group: no pool from it, and discovery is incomplete (nothing is gone)
    ec2.delete_launch_template(LaunchTemplateName="spot-t4")
    found = PoolDiscovery(ecs, asg, ec2).discover("small", NOW)
    assert found.pools == () and not found.complete
    assert [s.reason for s in found.skipped] == ["group t4's launch template version was not described"]


# ================================================================================ placement scores
def stubbed_ec2() -> tuple[Any, Stubber]:
    client = boto3.session.Session().client("ec2", region_name=REGION)
    return client, Stubber(client)


def test_placement_scores_request_and_answer():
    ec2, stub = stubbed_ec2()
    stub.add_response(
        "get_spot_placement_scores",
        {
            "SpotPlacementScores": [
                {"AvailabilityZoneId": "use1-az4", "Score": 9},
                {"AvailabilityZoneId": "use1-az6", "Score": 3},
            ]
        },
        {
            "InstanceTypes": ["g5.2xlarge", "g5.xlarge", "g6.xlarge"],
            "TargetCapacity": 1,
            "SingleAvailabilityZone": True,
            "RegionNames": [REGION],
        },
    )
    with stub:
        scores = PoolDiscovery(None, None, ec2).placement_scores(
            {"g6.xlarge", "g5.xlarge", "g5.2xlarge"}, REGION
        )
    stub.assert_no_pending_responses()
    assert scores == {"use1-az4": 9, "use1-az6": 3}


def test_a_placement_score_error_is_no_score():
    ec2, stub = stubbed_ec2()
    stub.add_client_error(
        "get_spot_placement_scores", "MaxConfigLimitExceeded", "Too many configurations", 400
    )
    with stub:
        assert (
            PoolDiscovery(None, None, ec2).placement_scores({"g5.xlarge", "g6.xlarge", "g4dn.xlarge"}, REGION)
            == {}
        )


# ======================================================================================= the ledger
def test_the_store_round_trip(world):
    make_cluster(world["ec2"], world["asg"], world["ecs"], ["g5.xlarge", "g5.2xlarge"])
    found = PoolDiscovery(world["ecs"], world["asg"], world["ec2"]).discover(CLUSTER, NOW)
    store = DynamoPoolStore(world["ddb"], TABLE)
    saved = store.save_discovered(CLUSTER, found.pools, NOW)
    assert [p.name for p in saved] == sorted(SPOT + ON_DEMAND)
    assert store.pools(CLUSTER) == saved and store.pools("other") == []
    item = world["ddb"].get_item(TableName=TABLE, Key={"pk": {"S": "pool#gpu-spot"}, "sk": {"S": SPOT[0]}})[
        "Item"
    ]
    assert item["rev"] == {"N": "1"} and item["gone"] == {"BOOL": False} and "expires_at" not in item

    # a fact, twice: one write
    failure = Observation(at=NOW, available=False, source="launch-failure", detail="no g5.2xlarge capacity")
    after = store.record(CLUSTER, SPOT[0], failure)
    assert after is not None and after.unavailable_until == NOW + timedelta(minutes=15)
    assert store.record(CLUSTER, SPOT[0], failure) == after
    assert _rev(world, SPOT[0]) == 2
    assert store.record(CLUSTER, "gpu-spot-gpu1-spot/p5.48xlarge/us-east-1a", failure) is None

    # prices and scores
    quotes = [SpotQuote(instance_type="g5.xlarge", availability_zone="us-east-1a", price=0.41, at=NOW)]
    assert store.set_prices(CLUSTER, quotes) == 1
    assert store.set_prices(CLUSTER, quotes) == 0
    zone_id = next(p.availability_zone_id for p in saved if p.name == SPOT[2])
    score = ScoreQuote(capacity_provider="gpu-spot-gpu1-spot", availability_zone_id=zone_id, score=8, at=NOW)
    assert store.set_scores(CLUSTER, [score]) == 2  # both types in that zone
    pools = {p.name: p for p in store.pools(CLUSTER)}
    assert pools[SPOT[2]].spot_price == 0.41 and pools[SPOT[2]].placement_score == 8

    # discovery again keeps the facts, prices and scores; a pool no longer found is gone (and expires)
    later = NOW + timedelta(hours=1)
    rest = [p for p in found.pools if p.name != ON_DEMAND[1]]
    again = store.save_discovered(CLUSTER, rest, later)
    assert ON_DEMAND[1] not in {p.name for p in again}
    kept = {p.name: p for p in again}
    assert kept[SPOT[0]].observations == (failure,) and kept[SPOT[2]].spot_price == 0.41
    gone = {p.name: p for p in store.pools(CLUSTER, include_gone=True)}[ON_DEMAND[1]]
    assert gone.gone_since == later
    item = world["ddb"].get_item(
        TableName=TABLE, Key={"pk": {"S": "pool#gpu-spot"}, "sk": {"S": ON_DEMAND[1]}}
    )["Item"]
    assert int(item["expires_at"]["N"]) == int((later + timedelta(days=GONE_RETENTION_DAYS)).timestamp())
    # incomplete discovery takes nothing for gone; found again, the pool is back with its facts
    store.save_discovered(CLUSTER, [], later, complete=False)
    assert len(store.pools(CLUSTER)) == len(rest)
    back = store.save_discovered(CLUSTER, found.pools, later)
    assert ON_DEMAND[1] in {p.name for p in back}


def test_a_write_that_loses_the_race_applies_its_change_again(world):
    make_cluster(world["ec2"], world["asg"], world["ecs"], ["g5.xlarge", "g5.2xlarge"])
    found = PoolDiscovery(world["ecs"], world["asg"], world["ec2"]).discover(CLUSTER, NOW)
    store = DynamoPoolStore(world["ddb"], TABLE)
    store.save_discovered(CLUSTER, found.pools, NOW)
    other = DynamoPoolStore(boto3.session.Session().client("dynamodb", region_name=REGION), TABLE)
    first = Observation(at=NOW, available=True, source="launch", detail="i-1")
    second = Observation(at=NOW + timedelta(minutes=1), available=False, source="interruption", detail="i-1")
    raced: list[str] = []

    def race(params: dict[str, Any], **_: Any) -> None:
        # Another writer records its fact between our read and our write, once.
        if not raced and params.get("Item", {}).get("sk", {}).get("S") == SPOT[0]:
            raced.append("once")
            other.record(CLUSTER, SPOT[0], second)

    world["ddb"].meta.events.register("before-parameter-build.dynamodb.PutItem", race)
    try:
        after = store.record(CLUSTER, SPOT[0], first)
    finally:
        world["ddb"].meta.events.unregister("before-parameter-build.dynamodb.PutItem", race)
    assert raced and after is not None
    assert [o.source for o in after.observations] == ["launch", "interruption"]
    assert _rev(world, SPOT[0]) == 3


# ======================================================================================= the service
def test_refresh_discovers_prices_scores_and_caches(world):
    make_cluster(world["ec2"], world["asg"], world["ecs"], ["g5.xlarge", "g5.2xlarge", "g6.xlarge"])
    ec2 = world["ec2"]
    asked: list[dict[str, Any]] = []

    def scores(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        # moto has no GetSpotPlacementScores: answer it here, after botocore validated the request.
        zones = ec2.describe_subnets()["Subnets"]
        answer = [{"AvailabilityZoneId": s["AvailabilityZoneId"], "Score": 7} for s in zones]
        return AWSResponse("local://ec2", 200, {}, None), {"SpotPlacementScores": answer}

    calls: list[str] = []
    ec2.meta.events.register(
        "before-parameter-build.ec2.GetSpotPlacementScores", lambda params, **_: asked.append(params)
    )
    ec2.meta.events.register("before-call.ec2.GetSpotPlacementScores", scores)
    ec2.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", lambda **_: calls.append("prices"))
    service = PoolService(
        PoolDiscovery(world["ecs"], world["asg"], ec2),
        DynamoPoolStore(world["ddb"], TABLE),
        REGION,
        PoolSettings(),
    )
    pools = service.refresh(CLUSTER, NOW).pools
    spot = [p for p in pools if p.market == "spot"]
    assert len(spot) == 6 and len(pools) == 8
    assert all(p.spot_price is not None and p.spot_priced_at == NOW for p in spot)
    assert all(p.placement_score == 7 and p.scored_at == NOW for p in spot)
    assert all(p.spot_price is None and p.placement_score is None for p in pools if p.market == "on-demand")
    assert len(asked) == 1 and asked[0]["InstanceTypes"] == ["g5.2xlarge", "g5.xlarge", "g6.xlarge"]
    assert calls == ["prices"]

    # within the TTLs nothing is asked again, and nothing changed is written; past the price TTL only
    # prices are asked
    writes: list[str] = []
    world["ddb"].meta.events.register(
        "before-parameter-build.dynamodb.PutItem", lambda **_: writes.append("put")
    )
    service.refresh(CLUSTER, NOW + timedelta(minutes=30))
    assert len(asked) == 1 and calls == ["prices"] and writes == []
    service.refresh(CLUSTER, NOW + timedelta(hours=1))
    assert len(asked) == 1 and calls == ["prices", "prices"]

    # the jobs path: options, one Query; a launch failure makes its pool unavailable for a while
    name = "gpu-spot-gpu1-spot/g6.xlarge/us-east-1a"
    failure = Observation(at=NOW + timedelta(hours=1), available=False, source="launch-failure", detail="ICE")
    assert service.record_fact(CLUSTER, name, failure) is not None
    options = {
        o.name: o for o in pool_options(service.pools(CLUSTER), NOW + timedelta(hours=1, minutes=5), 1 / 6)
    }
    assert sorted(options) == sorted(p.name for p in spot)
    assert not options[name].available and options[name].history is not None
    assert all(o.available and o.placement_score == 7 for n, o in options.items() if n != name)
    recorded = service.record_group_fact(
        CLUSTER,
        "gpu1-spot",
        Observation(at=NOW + timedelta(hours=1), available=False, source="launch-failure", detail="zone b"),
        availability_zone="us-east-1b",
    )
    assert len(recorded) == 3


def test_a_failed_score_request_is_no_score_until_the_next_is_due(world):
    make_cluster(world["ec2"], world["asg"], world["ecs"], ["g5.xlarge", "g5.2xlarge", "g6.xlarge"])
    ec2 = world["ec2"]
    asked: list[str] = []

    def refuse(**_: Any) -> None:
        asked.append("scores")
        raise ClientError(
            {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "GetSpotPlacementScores"
        )

    ec2.meta.events.register("before-call.ec2.GetSpotPlacementScores", refuse)
    service = PoolService(
        PoolDiscovery(world["ecs"], world["asg"], ec2), DynamoPoolStore(world["ddb"], TABLE), REGION
    )
    pools = service.refresh(CLUSTER, NOW).pools
    assert asked == ["scores"]
    assert all(p.placement_score is None for p in pools)
    assert all(p.scored_at == NOW for p in pools if p.market == "spot")
    service.refresh(CLUSTER, NOW + timedelta(hours=1))
    assert asked == ["scores"]
    service.refresh(CLUSTER, NOW + timedelta(hours=6))
    assert asked == ["scores", "scores"]


def _rev(world: dict[str, Any], name: str) -> int:
    item = world["ddb"].get_item(TableName=TABLE, Key={"pk": {"S": "pool#gpu-spot"}, "sk": {"S": name}})[
        "Item"
    ]
    return int(item["rev"]["N"])


def test_a_price_request_refused_for_one_type_loses_that_price_only_and_a_failed_discovery_is_counted(
    world, caplog
):
    """Issue 29: one failed DescribeSpotPriceHistory discarded the whole sweep's discovery of the cluster,
    and PlacementAdvisor.refresh swallowed the error (reconcile said pools=0, failed=0)."""
    from spotguard.usecases.jobs.advisor import PlacementAdvisor

    make_cluster(world["ec2"], world["asg"], world["ecs"], ["g5.xlarge", "g5.2xlarge"])
    ec2, asg = world["ec2"], world["asg"]
    requested: list[list[str]] = []
    message = "The following supplied instance types do not exist: [g5.2xlarge]"

    def refuse(**_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if "g5.2xlarge" not in requested[-1]:
            return None  # moto answers
        body = {"Error": {"Code": "InvalidParameterValue", "Message": message}}
        return AWSResponse("local://ec2", 400, {}, None), body

    ec2.meta.events.register(
        "before-parameter-build.ec2.DescribeSpotPriceHistory",
        lambda params, **_: requested.append(list(params["InstanceTypes"])),
    )
    ec2.meta.events.register("before-call.ec2.DescribeSpotPriceHistory", refuse)
    service = PoolService(PoolDiscovery(world["ecs"], asg, ec2), DynamoPoolStore(world["ddb"], TABLE), REGION)
    refreshed = service.refresh(CLUSTER, NOW)
    assert sorted(p.name for p in refreshed.pools) == sorted(SPOT + ON_DEMAND)  # discovery kept
    (error,) = refreshed.errors
    assert "spot prices of g5.2xlarge" in error and "InvalidParameterValue" in error and message in error
    assert requested == [["g5.2xlarge", "g5.xlarge"], ["g5.2xlarge"], ["g5.xlarge"]]
    by_name = {p.name: p for p in refreshed.pools}
    assert all(by_name[n].spot_price is not None for n in SPOT if "/g5.xlarge/" in n)
    assert all(by_name[n].spot_price is None for n in SPOT if "/g5.2xlarge/" in n)  # unknown, not guessed

    # Auto Scaling refuses: that cluster's discovery fails, is logged with its reason and counted
    def denied(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        body = {"Error": {"Code": "AccessDenied", "Message": "not authorized: DescribeAutoScalingGroups"}}
        return AWSResponse("local://autoscaling", 403, {}, None), body

    asg.meta.events.register("before-call.autoscaling.DescribeAutoScalingGroups", denied)
    later = NOW + timedelta(hours=1)
    advisor = PlacementAdvisor(service, store=None, clock=lambda: later, clusters=(CLUSTER,))  # type: ignore[arg-type]
    (refreshed,) = advisor.refresh(())
    assert refreshed.pools == ()
    (line,) = refreshed.errors
    assert line.startswith(f"cluster {CLUSTER}: discovery failed: ClientError: ") and "AccessDenied" in line
    assert line in caplog.text
    assert len(service.pools(CLUSTER)) == len(SPOT + ON_DEMAND)  # what was known stays

"""Each capacity decision turned into the right RunTask, and launch failures marking a pool, in the live
system over moto (issue 18's "Done when"): an on-demand or spot decision in a provider spanning two zones
(or types) is a RunTask with that provider as its strategy, no launch type, and the zone (and type)
pinned by the first placement constraint; a decision to wait makes no RunTask and is kept on the job
with its reason; a task left PROVISIONING past `provisioning_timeout_seconds` marks its pool and the job
is launched elsewhere.

The GpuScheduler plays ECS's placement (it honours the strategy's providers and the memberOf
constraints) and keeps every RunTask request in `scheduler.requests`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spotguard_cli.emulator.gpucluster import Host, PoolGroup
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

from .conftest import fresh_aws
from .test_capacity import _launch_failed, _pools, _provider, cluster_with_pools

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

# one spot and one on-demand provider, each an Auto Scaling group over two zones: two pools each
SPREAD = [
    PoolGroup("gpu-spot-ab", "gpu-spot-ab-group", "g5.xlarge", ("us-east-1a", "us-east-1b"), spot=True),
    PoolGroup("gpu-od", "gpu-od-group", "g5.xlarge", ("us-east-1a", "us-east-1b"), spot=False),
]
ZONE_PIN = "attribute:ecs.availability-zone == {}"
OWN = {"type": "memberOf", "expression": "attribute:ecs.instance-type != p3.2xlarge"}  # the user's own


@pytest.fixture
def world() -> Iterator[JobsWorld]:
    """test_capacity's cluster, its pools discovered."""
    for w in cluster_with_pools():
        assert w.reconcile()["pools"] == 4
        yield w


@pytest.fixture
def spread() -> Iterator[tuple[JobsWorld, dict[str, Host]]]:
    """SPREAD's two providers, each with an instance in both zones (spot and on-demand hosts)."""
    with fresh_aws():
        w = make_jobs_world()
        w.cluster.add_pools(w.stack.client("autoscaling"), SPREAD)
        hosts = {
            "spot-a": w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-spot-ab"),
            "spot-b": w.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-spot-ab"),
            "od-a": w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-od", spot=False),
            "od-b": w.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-od", spot=False),
        }
        assert w.reconcile()["pools"] == 4
        yield w, hosts


def _submit(world: JobsWorld, request: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """A 1-GPU job submitted with the launch type EC2 and the user's own constraint (`OWN`)."""
    td = world.cluster.gpu_task_definition(gpus=1)
    asked = {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2", "placementConstraints": [OWN]}
    answer = world.invoke({"action": "submit", "request": {**asked, **(request or {})}, "options": options})
    assert answer["ok"], answer
    return answer["job"]


def _placed_on(world: JobsWorld, task_arn: str) -> str:
    """The container instance the scheduler placed the task on."""
    return world.scheduler.placed[task_arn]


def test_an_on_demand_decision_is_a_runtask_on_the_on_demand_provider_pinned_to_its_zone(spread):
    world, hosts = spread
    now = datetime.now(UTC)
    for zone in ("us-east-1a", "us-east-1b"):  # no spot anywhere for now
        _launch_failed(world, "gpu-spot-ab-group", zone, now)
    # 4 hours of work due in 4.3: nothing but on-demand meets the deadline
    job = _submit(world, work_hours=4, deadline=(now + timedelta(hours=4.3)).isoformat())
    assert job["state"] == "running"
    (request,) = world.scheduler.requests
    status = world.status(job["job_id"])
    (decision,) = status["decisions"]
    assert decision["placement"] == "on-demand" and decision["capacity_provider"] == "gpu-od"
    zone = decision["availability_zone"]
    assert decision["pool"] == f"gpu-od/g5.xlarge/{zone}" and decision["constrain_zone"]
    assert "launchType" not in request
    assert request["capacityProviderStrategy"] == [{"capacityProvider": "gpu-od", "weight": 1, "base": 0}]
    # the pool's zone first (ECS keeps 10 constraints), then the request's own
    assert request["placementConstraints"] == [{"type": "memberOf", "expression": ZONE_PIN.format(zone)}, OWN]
    attempt = status["attempts"][-1]
    assert (attempt["market"], attempt["pool"]) == ("on-demand", decision["pool"])
    assert _placed_on(world, attempt["task_arn"]) == hosts[f"od-{zone[-1]}"].container_instance_arn


def test_a_spot_decision_in_a_provider_over_two_zones_pins_the_zone_the_policy_chose(spread):
    world, hosts = spread
    # us-east-1a's spot cannot launch; the provider's group still can in us-east-1b
    _launch_failed(world, "gpu-spot-ab-group", "us-east-1a", datetime.now(UTC))
    pools = _pools(world)
    assert pools["gpu-spot-ab/g5.xlarge/us-east-1a"]["unavailable_until"] is not None
    assert pools["gpu-spot-ab/g5.xlarge/us-east-1b"]["unavailable_until"] is None
    job = _submit(world, work_hours=10)
    assert job["state"] == "running"
    (request,) = world.scheduler.requests
    (decision,) = world.status(job["job_id"])["decisions"]
    assert decision["placement"] == "spot" and decision["pool"] == "gpu-spot-ab/g5.xlarge/us-east-1b"
    assert "launchType" not in request and _provider(request) == "gpu-spot-ab"
    assert request["placementConstraints"] == [
        {"type": "memberOf", "expression": ZONE_PIN.format("us-east-1b")},
        OWN,
    ]
    # without the pin ECS could have placed it in us-east-1a (the scheduler's binpack takes the first
    # host of the provider there): the pin is what keeps the task in the pool the policy chose
    task_arn = world.status(job["job_id"])["attempts"][-1]["task_arn"]
    assert _placed_on(world, task_arn) == hosts["spot-b"].container_instance_arn


def test_a_decision_to_wait_makes_no_runtask_and_is_kept_on_the_job_with_its_reason(world: JobsWorld):
    now = datetime.now(UTC)
    _launch_failed(world, "gpu-spot-a-group", "us-east-1a", now)
    _launch_failed(world, "gpu-spot-b-group", "us-east-1b", now)
    world.job_events()  # only what the submit says, below
    # no deadline and no spot now: the policy waits for spot (up to max_wait_hours) rather than pay on-demand
    job = _submit(world, work_hours=10)
    assert job["state"] == "queued"
    assert world.scheduler.requests == []
    status = world.status(job["job_id"])
    assert status["state"] == "queued" and status["attempts"] == [] and status.get("placement") is None
    (decision,) = status["decisions"]
    assert decision["placement"] == "none" and decision["servable"] is True and decision.get("pool") is None
    assert decision["reason"].startswith("no deadline: wait for spot")
    assert 60 <= decision["recheck_seconds"] <= 900
    assert status["last_reason"] == (
        f"waiting: {decision['reason']}; next decision in {decision['recheck_seconds']} s"
    )
    assert status["retry_at"] is not None
    said = [e for e in world.job_events() if e["detail-type"] == "SpotGuard Job Capacity Decision"]
    assert [e["detail"]["placement"] for e in said] == ["none"]


def test_a_task_left_provisioning_past_its_bound_marks_the_pool_and_the_job_goes_elsewhere(world: JobsWorld):
    job = world.submit(gpus=1, work_hours=10, provisioning_timeout_seconds=600)
    job_id = job["job_id"]
    (first_request,) = world.scheduler.requests
    first = world.status(job_id)["attempts"][-1]
    assert first["last_status"] == "PROVISIONING"  # no RUNNING event: it waits for an instance
    pool = first["pool"]
    from moto.ecs.models import ecs_backends  # and ECS says so too (reconcile asks it: issue 45, item 2)

    ecs_backends["123456789012"]["us-east-1"].tasks["gpu-spot"][
        first["task_arn"]
    ].last_status = "PROVISIONING"

    # within the bound, the task is left to wait
    world.shift_clock(300)
    assert world.reconcile()["provisioning_abandoned"] == 0
    assert _pools(world)[pool]["unavailable_until"] is None

    # past it: the pool is marked unavailable (a fact, a backoff) and the task stopped by SpotGuard
    world.shift_clock(700)
    counts = world.reconcile()
    assert counts["provisioning_abandoned"] == 1, counts
    marked = _pools(world)[pool]
    fact = marked["observations"][-1]
    assert (fact["source"], fact["available"]) == ("provisioning-timeout", False)
    assert first["task_arn"].rsplit("/", 1)[-1] in fact["detail"]
    assert marked["unavailable_until"] is not None and marked["backoff_streak"] == 1
    until = datetime.fromisoformat(marked["unavailable_until"])
    assert until > datetime.now(UTC) + timedelta(seconds=700)  # backed off from the functions' clock
    stopped = world.task(first["task_arn"])
    assert stopped["desiredStatus"] == "STOPPED" and "no instance in" in stopped["stoppedReason"]

    # its STOPPED event relaunches the job, in the other spot pool
    world.emit(first["task_arn"])
    status = world.status(job_id)
    assert status["state"] == "running" and len(status["attempts"]) == 2
    second = status["attempts"][-1]
    assert second["pool"] != pool and second["market"] == "spot"
    _, second_request = world.scheduler.requests
    assert _provider(second_request) != _provider(first_request)
    assert status["decisions"][-1]["pool"] == second["pool"]


def _mixed_provider(world: JobsWorld, name: str, types: tuple[str, ...], zones: tuple[str, ...]) -> None:
    """One more spot provider, its Auto Scaling group over several instance types (mixed instances
    overrides) and zones, as examples/gpu-cluster could make it; PoolGroup has one type only."""
    ec2, asg, ecs = (world.stack.client(s) for s in ("ec2", "autoscaling", "ecs"))
    subnets = [
        s["SubnetId"]
        for s in ec2.describe_subnets()["Subnets"]
        if s["CidrBlock"].startswith("10.8.") and s["AvailabilityZone"] in zones
    ]
    assert len(subnets) == len(zones)
    (template,) = ec2.describe_launch_templates(LaunchTemplateNames=["gpu-spot-gpu"])["LaunchTemplates"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=f"{name}-group",
        MinSize=0,
        MaxSize=10,
        VPCZoneIdentifier=",".join(subnets),
        MixedInstancesPolicy={
            "InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 0},
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {
                    "LaunchTemplateId": template["LaunchTemplateId"],
                    "Version": "$Latest",
                },
                "Overrides": [{"InstanceType": t} for t in types],
            },
        },
    )
    (group,) = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[f"{name}-group"])["AutoScalingGroups"]
    ecs.create_capacity_provider(
        name=name, autoScalingGroupProvider={"autoScalingGroupArn": group["AutoScalingGroupARN"]}
    )
    (cluster,) = ecs.describe_clusters(clusters=["gpu-spot"])["clusters"]
    ecs.put_cluster_capacity_providers(
        cluster="gpu-spot",
        capacityProviders=[*cluster["capacityProviders"], name],
        defaultCapacityProviderStrategy=[],
    )


def test_a_spot_decision_in_a_provider_over_two_types_and_zones_pins_both(spread):
    world, _ = spread
    _mixed_provider(world, "gpu-spot-mix", ("g5.xlarge", "g5.2xlarge"), ("us-east-1a", "us-east-1b"))
    # the mixed provider's instances, each type in each zone (g5.xlarge first: the policy takes
    # g5.2xlarge here (moto quotes every spot price alike), so only the type pin keeps it off g5.xlarge)
    mix = {
        (t, z): world.cluster.add_host(t, z, "gpu-spot-mix")
        for z in ("us-east-1a", "us-east-1b")
        for t in ("g5.xlarge", "g5.2xlarge")
    }
    assert world.reconcile()["pools"] == 8
    pools = _pools(world)
    for t in ("g5.xlarge", "g5.2xlarge"):
        for z in ("us-east-1a", "us-east-1b"):
            pool = pools[f"gpu-spot-mix/{t}/{z}"]
            assert pool["constrain_type"] and pool["constrain_zone"], pool["name"]
    now = datetime.now(UTC)
    for zone in ("us-east-1a", "us-east-1b"):
        _launch_failed(world, "gpu-spot-ab-group", zone, now)
    _launch_failed(world, "gpu-spot-mix-group", "us-east-1a", now)  # spot left: the mix in us-east-1b
    job = _submit(world, work_hours=10)
    (request,) = world.scheduler.requests
    (decision,) = world.status(job["job_id"])["decisions"]
    itype = decision["instance_type"]
    assert decision["placement"] == "spot" and decision["pool"] == f"gpu-spot-mix/{itype}/us-east-1b"
    assert "launchType" not in request and _provider(request) == "gpu-spot-mix"
    pin = f"attribute:ecs.instance-type == {itype} and {ZONE_PIN.format('us-east-1b')}"
    assert request["placementConstraints"] == [{"type": "memberOf", "expression": pin}, OWN]
    task_arn = world.status(job["job_id"])["attempts"][-1]["task_arn"]
    assert _placed_on(world, task_arn) == mix[(itype, "us-east-1b")].container_instance_arn


NOT_ASSOCIATED = (
    "The specified capacity provider strategy cannot contain a capacity provider that is not associated with "
    "the cluster. Associate the capacity provider with the cluster or specify a valid capacity provider and "
    "try again."
)


def test_a_provider_detached_since_the_sweep_marks_its_pools_and_the_job_launches_elsewhere(world: JobsWorld):
    """Issue 29: ECS refusing the decision's provider (InvalidParameterException, not associated with the
    cluster) failed the job. The GpuScheduler does not check the strategy against the cluster: ECS's
    check is played here, and the first launch's provider is detached just before its RunTask."""
    from botocore.exceptions import ClientError

    ecs, place = world.cluster.ecs, world.scheduler.run_task
    detached: list[str] = []

    def as_ecs(request: dict[str, Any]) -> dict[str, Any]:
        if not detached:  # the provider of the first launch leaves the cluster since the sweep
            detached.append(_provider(request))
            (cluster,) = ecs.describe_clusters(clusters=["gpu-spot"])["clusters"]
            ecs.put_cluster_capacity_providers(
                cluster="gpu-spot",
                capacityProviders=[p for p in cluster["capacityProviders"] if p != detached[0]],
                defaultCapacityProviderStrategy=[],
            )
        (cluster,) = ecs.describe_clusters(clusters=["gpu-spot"])["clusters"]
        if any(
            p["capacityProvider"] not in cluster["capacityProviders"]
            for p in request["capacityProviderStrategy"]
        ):
            error = {"Error": {"Code": "InvalidParameterException", "Message": NOT_ASSOCIATED}}
            raise ClientError(error, "RunTask")  # type: ignore[arg-type]
        return place(request)

    world.scheduler.run_task = as_ecs  # type: ignore[method-assign]
    job = world.submit(gpus=1, work_hours=10)
    assert job["state"] == "running", job
    first, second = world.scheduler.requests
    assert _provider(first) == detached[0] and _provider(second) != detached[0]
    status = world.status(job["job_id"])
    assert status["state"] == "running" and len(status["attempts"]) == 1
    assert status["attempts"][0]["pool"].split("/")[0] == _provider(second)
    assert [d["capacity_provider"] for d in status["decisions"]] == [detached[0], _provider(second)]
    gone = [p for n, p in _pools(world).items() if n.startswith(f"{detached[0]}/")]
    assert gone and all(p["unavailable_until"] is not None for p in gone)
    assert all(p["observations"][-1]["source"] == "provider-refused" for p in gone)
    assert "not associated with the cluster" in gone[0]["observations"][-1]["detail"]
    # the next sweep no longer finds the provider: its pools are gone
    assert world.reconcile()["pools"] == 3

"""Capacity in the live system, over moto: the cluster's pools discovered by reconcile, each launch placed
by the policy (the pool's capacity provider and zone in RunTask), pool failures (RunTask's, Auto
Scaling's) moving the next launch elsewhere, and a job no pool can serve saying so."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotguard_cli.emulator.gpucluster import PoolGroup
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

from .conftest import fresh_aws

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

SAMPLE = Path(__file__).resolve().parents[2] / "events" / "eventbridge" / "asg-launch-unsuccessful.json"
POOLS = [
    PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
    PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
    PoolGroup("gpu-od", "gpu-od-group", "g5.xlarge", ("us-east-1a", "us-east-1b"), spot=False),
]


@pytest.fixture
def world() -> Iterator[JobsWorld]:
    with fresh_aws():
        w = make_jobs_world()
        w.cluster.add_pools(w.stack.client("autoscaling"), POOLS)
        w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-spot-a")
        w.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-spot-b")
        w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-od", spot=False)
        yield w


def _pools(world: JobsWorld) -> dict[str, dict]:
    from spotguard.adapters.pool_store import PoolStore

    table = world.stack.outputs["LedgerTableName"]
    store = PoolStore(world.stack.client("dynamodb"), table)
    return {p.name: p.model_dump(mode="json") for p in store.pools("gpu-spot")}


def _provider(request: dict) -> str:
    (item,) = request["capacityProviderStrategy"]
    return str(item["capacityProvider"])


def test_reconcile_discovers_the_pools_and_a_launch_goes_where_the_policy_says(world: JobsWorld):
    counts = world.reconcile()
    assert counts["pools"] == 4  # two single-zone spot pools, and on-demand in two zones
    pools = _pools(world)
    assert set(pools) == {
        "gpu-spot-a/g5.xlarge/us-east-1a",
        "gpu-spot-b/g5.xlarge/us-east-1b",
        "gpu-od/g5.xlarge/us-east-1a",
        "gpu-od/g5.xlarge/us-east-1b",
    }
    assert pools["gpu-spot-a/g5.xlarge/us-east-1a"]["gpus_per_instance"] == 1

    job = world.submit(gpus=1, work_hours=10)
    assert job["state"] == "running"
    (request,) = world.scheduler.requests
    assert "launchType" not in request and _provider(request) in ("gpu-spot-a", "gpu-spot-b")
    status = world.status(job["job_id"])
    (decision,) = status["decisions"]
    assert decision["placement"] == "spot" and decision["capacity_provider"] == _provider(request)
    assert status["attempts"][0]["pool"] == decision["pool"]
    kinds = [e["detail-type"] for e in world.job_events()]
    assert "SpotGuard Job Capacity Decision" in kinds


def test_a_pool_runtask_cannot_fill_is_marked_and_the_job_goes_to_the_other(world: JobsWorld):
    world.reconcile()
    world.scheduler.refuse = 1  # the first pool tried has no room
    job = world.submit(gpus=1, work_hours=10)
    assert job["state"] == "running"
    first, second = world.scheduler.requests
    assert _provider(first) != _provider(second)
    tried = next(n for n in _pools(world) if n.startswith(_provider(first) + "/"))
    pool = _pools(world)[tried]
    assert pool["unavailable_until"] is not None
    assert pool["observations"][-1]["source"] == "runtask"


def test_an_auto_scaling_launch_failure_marks_the_group_s_pools(world: JobsWorld):
    world.reconcile()
    event = json.loads(SAMPLE.read_text())
    event["detail"]["AutoScalingGroupName"] = "gpu-spot-a-group"
    event["detail"]["Details"]["Availability Zone"] = "us-east-1a"
    event["time"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # a pool backs off from the event's time
    world.put(copy.deepcopy(event))
    world.task_events.drain()
    pool = _pools(world)["gpu-spot-a/g5.xlarge/us-east-1a"]
    assert pool["unavailable_until"] is not None and pool["observations"][-1]["source"] == "launch-failure"
    job = world.submit(gpus=1, work_hours=10)
    (request,) = world.scheduler.requests
    assert _provider(request) == "gpu-spot-b" and job["state"] == "running"


def test_a_job_no_pool_can_serve_says_so_and_waits(world: JobsWorld):
    world.reconcile()
    job = world.submit(gpus=8, work_hours=10)
    assert job["state"] == "queued" and world.scheduler.requests == []
    status = world.status(job["job_id"])
    (decision,) = status["decisions"]
    assert decision["placement"] == "none" and decision["servable"] is False
    assert "8 GPUs" in decision["reason"]
    assert "8 GPUs" in status["last_reason"]

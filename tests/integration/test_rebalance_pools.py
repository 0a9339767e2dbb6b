"""A rebalance recommendation reaches the pool its instance is in (issue 18), in the live system over
moto: reconcile discovers the pools, the recommendation goes through the interruption queue, and the
pool in the ledger holds one "rebalance" fact however often the event is delivered, still available.

moto's container instances carry the `ecs.instance-type` and `ecs.availability-zone` attributes but no
`capacityProviderName`: the first test takes that path (the one spot pool of the type and zone); the
second adds the provider to DescribeContainerInstances' answer, as ECS gives it, after botocore parsed it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotguard.adapters import clients
from spotguard_cli.emulator.gpucluster import Host, PoolGroup
from spotguard_cli.emulator.inject import make_event
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world

from .conftest import fresh_aws

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

POOLS = [
    PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
    PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
    PoolGroup("gpu-od", "gpu-od-group", "g5.xlarge", ("us-east-1a", "us-east-1b"), spot=False),
]
POOL_A = "gpu-spot-a/g5.xlarge/us-east-1a"


@pytest.fixture
def world() -> Iterator[tuple[JobsWorld, Host]]:
    with fresh_aws():
        w = make_jobs_world()
        w.cluster.add_pools(w.stack.client("autoscaling"), POOLS)
        host = w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-spot-a")
        w.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-spot-b")
        assert w.reconcile()["pools"] == 4
        yield w, host


def _pools(world: JobsWorld) -> dict[str, Any]:
    from spotguard.adapters.pool_store import DynamoPoolStore

    store = DynamoPoolStore(world.stack.client("dynamodb"), world.stack.outputs["LedgerTableName"])
    return {p.name: p for p in store.pools("gpu-spot")}


def _deliver(world: JobsWorld, *bodies: str) -> None:
    for body in bodies:
        world.interruptions.sqs.send_message(QueueUrl=world.interruptions.queue_url, MessageBody=body)
    assert world.interruptions.drain()[1] == 0  # nothing failed


def test_a_rebalance_recommendation_is_one_fact_on_the_instance_s_pool_however_often_it_comes(world):
    w, host = world
    td = w.cluster.gpu_task_definition("train", gpus=1)
    (task,) = w.cluster.start(host, td)
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    body = json.dumps(make_event("rebalance-recommendation", host.instance_id, at=at))
    # The first try keeps the fact, then fails to write the notice's record (say, throttled): SQS
    # delivers the notice again, and the retry does it all again, the fact included.
    failed = {"n": 0}

    def lose_the_notice_record(params: dict[str, Any], **_: Any) -> None:
        if "outcome = :o" in json.loads(params["body"]).get("UpdateExpression", "") and not failed["n"]:
            failed["n"] += 1
            raise ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "UpdateItem"
            )

    clients.on_event("before-call.dynamodb.UpdateItem", lose_the_notice_record)
    poller = w.interruptions
    poller.sqs.send_message(QueueUrl=poller.queue_url, MessageBody=body)
    assert poller.drain() == (1, 1) and failed["n"] == 1
    assert len(_pools(w)[POOL_A].observations) == 1  # kept before the record failed
    later = datetime.now(UTC) + timedelta(seconds=61)  # the visibility timeout: the try's lease ran out
    poller.host.module.runtime.service.clock = lambda: later
    for receipt in poller.failed_receipts:
        poller.sqs.change_message_visibility(
            QueueUrl=poller.queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
        )
    assert poller.drain() == (1, 0)
    _deliver(w, body)  # and EventBridge's own second delivery, once the notice was handled

    pools = _pools(w)
    pool = pools[POOL_A]
    rebalances = [o for o in pool.observations if o.source == "rebalance"]
    assert [(o.at, o.detail, o.available) for o in rebalances] == [(at, host.instance_id, True)]
    assert pool.rebalances.value_at(at) == pytest.approx(1.0)
    # a risk signal: the pool is not backed off, and the task was asked to checkpoint, not stopped
    assert pool.unavailable_until is None and pool.available_at(datetime.now(UTC))
    assert w.task(task)["desiredStatus"] == "RUNNING"
    # no other pool heard of it (the on-demand pool of the same type and zone included)
    assert all(not p.rebalances.value for name, p in pools.items() if name != POOL_A)


def test_the_capacity_provider_ecs_names_decides_the_pool(world):
    w, host = world
    named: dict[str, str] = {}

    def as_ecs_answers(parsed: dict[str, Any], **_: Any) -> None:
        for ci in parsed.get("containerInstances") or []:
            if ci.get("ec2InstanceId") in named:
                ci["capacityProviderName"] = named[ci["ec2InstanceId"]]

    clients.on_event("after-call.ecs.DescribeContainerInstances", as_ecs_answers)
    calls: list[str] = []
    clients.on_every_call(lambda model, **_: calls.append(model.name))

    # ECS names the pool's provider: the pool is read and written by its name (no Query of the pools)
    named[host.instance_id] = "gpu-spot-a"
    _deliver(w, json.dumps(make_event("rebalance-recommendation", host.instance_id)))
    last = len(calls) - 1 - calls[::-1].index("DescribeContainerInstances")
    assert calls[last:] == ["DescribeContainerInstances", "GetItem", "PutItem", "UpdateItem"]  # the record
    assert _pools(w)[POOL_A].rebalances.value > 0

    # a provider that is no pool (say, one tagged spotguard:pool=ignore): no fact, though a spot pool
    # of the instance's type and zone exists
    other = w.cluster.add_host("g5.xlarge", "us-east-1a")
    named[other.instance_id] = "not-a-pool"
    _deliver(w, json.dumps(make_event("rebalance-recommendation", other.instance_id)))
    assert [o.detail for o in _pools(w)[POOL_A].observations if o.source == "rebalance"] == [host.instance_id]

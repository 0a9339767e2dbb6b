"""The jobs path's ECS port (`JobEcs`: adapters/job_ecs.py JobEcsAdapter), the same cases against its
fake (tests/fakes.py FakeJobEcs, answering as ECS would: no scripted results) and against the adapter on
moto: RunTask's parameters checked by ECS's API model, a launch started on an ACTIVE container instance
and described as asked, each way a launch fails (a malformed request, an unknown cluster or task
definition: request; no ACTIVE instance: capacity), tasks described one at a time and a hundred at a time
(with those ECS has forgotten), a stop, task definitions as the jobs path reads them (with GPU overrides),
and the most GPUs an instance of a cluster has.

Each side's `world` sets up what ECS holds: on moto a cluster of simulated instances (the emulator's
GpuCluster), registered task definitions and drained hosts through ECS's own calls; on the fake its
state (add_cluster, add_host, register).

What moto cannot do, so no case holds it: RunTask's client token (moto ignores it: neither the same task
answered again nor a ConflictException naming it, which the adapter takes as the attempt); GPUs as a
placement resource and a registered GPU resource (moto places by CPU and memory only, and drops an
instance's registered GPUs: `largest_gpus` is held by instance type only); RunTask's `failures` (moto
places nothing without saying why; real ECS names a reason such as RESOURCE:GPU); a task's PROVISIONING
and PENDING (moto's tasks start RUNNING); DescribeTasks' MISSING failures (moto leaves a forgotten task out
of its answer, which the adapter also counts as missing); StopTask of a task ECS does not know (moto raises
a bare Exception)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotguard.adapters.job_ecs import JobEcsAdapter
from spotguard.domain.jobs.replies import TaskDefinitionInfo
from spotguard.domain.tasks import JOB_TAG, MANAGED_TAG
from spotguard_cli.emulator.gpucluster import GpuCluster
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import AWS_ACCOUNT, AWS_REGION, FakeJobEcs

CLUSTER = "gpu-spot"
CLUSTER_ARN = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:cluster/{CLUSTER}"
UNKNOWN_TASK = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task/{CLUSTER}/{'f' * 32}"
ROLE = f"arn:aws:iam::{AWS_ACCOUNT}:role"
TRAIN = {
    "family": "train-2gpu",
    "taskRoleArn": f"{ROLE}/train",
    "executionRoleArn": f"{ROLE}/ecs-execution",
    "networkMode": "bridge",
    "containerDefinitions": [
        {
            "name": "train",
            "image": "spotguard/examples-train:latest",
            "memory": 32,
            "resourceRequirements": [{"type": "GPU", "value": "2"}],
            "environment": [{"name": "EPOCHS", "value": "90"}],
            "mountPoints": [{"sourceVolume": "checkpoints", "containerPath": "/ckpt"}],
        },
        {"name": "metrics", "image": "busybox", "memory": 8, "environment": [{"name": "PORT", "value": ""}]},
    ],
    "volumes": [{"name": "checkpoints", "configuredAtLaunch": True}, {"name": "scratch", "host": {}}],
}


def params(task_definition: str, **kw: Any) -> dict[str, Any]:
    """RunTask's parameters as the jobs path makes them for attempt 1 of job j1."""
    base = {
        "cluster": CLUSTER,
        "taskDefinition": task_definition,
        "launchType": "EC2",
        "startedBy": "spotguard/j1/1",
        "clientToken": "j1/1/1",
        "tags": [{"key": JOB_TAG, "value": "j1"}, {"key": MANAGED_TAG, "value": "true"}],
        "overrides": {
            "containerOverrides": [{"name": "train", "environment": [{"name": "RESUME", "value": ""}]}]
        },
    }
    return {**base, **kw}


class MotoWorld:
    def __init__(self, ecs: Any, ec2: Any) -> None:
        self.ecs, self.ec2 = ecs, ec2
        self.clusters: dict[str, GpuCluster] = {}

    def host(self, instance_type: str = "g5.xlarge", cluster: str = CLUSTER) -> str:
        if cluster not in self.clusters:
            self.clusters[cluster] = GpuCluster(self.ecs, self.ec2, name=cluster)
        return self.clusters[cluster].add_host(instance_type).container_instance_arn

    def drain(self, host: str, cluster: str = CLUSTER) -> None:
        self.ecs.update_container_instances_state(
            cluster=cluster, containerInstances=[host], status="DRAINING"
        )

    def register(self, **definition: Any) -> str:
        return str(self.ecs.register_task_definition(**definition)["taskDefinition"]["taskDefinitionArn"])


class FakeWorld:
    def __init__(self, fake: FakeJobEcs) -> None:
        self.fake = fake

    def host(self, instance_type: str = "g5.xlarge", cluster: str = CLUSTER) -> str:
        if cluster not in self.fake.clusters:
            self.fake.add_cluster(cluster)
        return self.fake.add_host(cluster, instance_type)

    def drain(self, host: str, cluster: str = CLUSTER) -> None:
        self.fake.hosts[host]["status"] = "DRAINING"

    def register(self, **definition: Any) -> str:
        return self.fake.register(**definition)


@dataclass
class Side:
    name: str
    ecs: Any  # JobEcsAdapter | FakeJobEcs
    world: Any  # MotoWorld | FakeWorld


def fake_side() -> Side:
    fake = FakeJobEcs()
    return Side("fake", fake, FakeWorld(fake))


def moto_side(aws: Clients) -> Side:
    return Side("moto", JobEcsAdapter(aws["ecs"]), MotoWorld(aws["ecs"], aws["ec2"]))


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("ecs", "ec2"), fake_side, moto_side)


# ------------------------------------------------------------------------------- checking a request
def test_a_request_is_checked_by_ecss_model_and_what_is_wrong_said_in_one_line(side: Side):
    assert side.ecs.check_run_task(params("train-2gpu:1")) is None
    assert side.ecs.check_run_task({"cluster": CLUSTER, "count": "two"}) == (
        'Missing required parameter in input: "taskDefinition"'
    )
    assert side.ecs.check_run_task(params("train-2gpu:1", count="two")).startswith(
        "Invalid type for parameter count"
    )


# ------------------------------------------------------------------------------------------ launches
def test_a_launch_starts_a_task_described_as_it_was_asked(side: Side):
    host = side.world.host()
    td = side.world.register(**TRAIN)
    result = side.ecs.run_task(params(td))
    assert result.failure is None and result.task_arn
    task = side.ecs.describe_task(CLUSTER, result.task_arn)
    assert (task.task_arn, task.cluster_arn, task.task_definition_arn) == (result.task_arn, CLUSTER_ARN, td)
    assert task.container_instance_arn == host
    assert task.started_by == "spotguard/j1/1" and task.job_ref == ("j1", 1)
    assert task.tags == {JOB_TAG: "j1", MANAGED_TAG: "true"}
    assert task.overrides == params(td)["overrides"]
    assert task.desired_status == "RUNNING" and task.last_status in ("PROVISIONING", "PENDING", "RUNNING")
    assert [c["name"] for c in task.containers][:1] == ["train"]


def test_a_malformed_launch_fails_as_a_request_error(side: Side):
    side.world.host()
    side.world.register(**TRAIN)
    result = side.ecs.run_task(params("train-2gpu:1", count="two"))
    assert (result.failure, result.task_arn) == ("request", None)
    assert "Invalid type for parameter count" in result.reason


def test_a_launch_on_a_cluster_ecs_does_not_know_fails_as_a_request_error(side: Side):
    side.world.host()
    side.world.register(**TRAIN)
    result = side.ecs.run_task(params("train-2gpu:1", cluster="no-such-cluster"))
    assert (result.failure, result.task_arn) == ("request", None)
    assert result.reason.startswith("ClusterNotFoundException")


def test_a_launch_of_a_task_definition_ecs_does_not_know_fails_as_a_request_error(side: Side):
    side.world.host()
    side.world.register(**TRAIN)
    result = side.ecs.run_task(params("no-such-family:7"))
    assert (result.failure, result.task_arn) == ("request", None)
    assert result.reason.startswith("ClientException")


def test_a_launch_with_no_active_instance_places_nothing_and_waits_for_capacity(side: Side):
    host = side.world.host()
    side.world.drain(host)
    td = side.world.register(**TRAIN)
    result = side.ecs.run_task(params(td))
    assert (result.failure, result.task_arn) == ("capacity", None)


# ---------------------------------------------------------------------------------- descriptions
def test_a_task_ecs_does_not_know_is_not_described(side: Side):
    side.world.host()
    started = side.ecs.run_task(params(side.world.register(**TRAIN))).task_arn
    assert side.ecs.describe_task(CLUSTER, UNKNOWN_TASK) is None
    assert side.ecs.describe_task(CLUSTER, started).task_arn == started


def test_many_tasks_are_described_a_hundred_at_a_time_and_the_forgotten_named(side: Side):
    side.world.host()
    td = side.world.register(**TRAIN)
    started = [side.ecs.run_task(params(td, clientToken=f"j{n}/1/1")).task_arn for n in range(101)]
    found, missing = side.ecs.describe_many(CLUSTER, [*started, UNKNOWN_TASK])
    assert sorted(found) == sorted(started)
    assert all(found[a].task_arn == a and found[a].desired_status == "RUNNING" for a in started)
    assert missing == [UNKNOWN_TASK]


def test_a_stopped_task_is_described_with_its_stop_and_its_reason(side: Side):
    side.world.host()
    td = side.world.register(**TRAIN)
    arn = side.ecs.run_task(params(td)).task_arn
    side.ecs.stop_task(CLUSTER, arn, "SpotGuard: job j1 cancelled")
    side.ecs.stop_task(CLUSTER, arn, "SpotGuard: job j1 cancelled")  # a repeated stop is no error
    task = side.ecs.describe_task(CLUSTER, arn)
    assert (task.desired_status, task.stopped_reason) == ("STOPPED", "SpotGuard: job j1 cancelled")


# ------------------------------------------------------------------------------- task definitions
def test_a_task_definition_is_read_as_the_jobs_path_needs_it(side: Side):
    arn = side.world.register(**TRAIN)
    info = TaskDefinitionInfo(
        arn=arn,
        family="train-2gpu",
        task_role_arn=f"{ROLE}/train",
        execution_role_arn=f"{ROLE}/ecs-execution",
        network_mode="bridge",
        containers=["train", "metrics"],
        gpus=2,
        volumes_at_launch=["checkpoints"],
        mounts={"train": {"checkpoints": "/ckpt"}, "metrics": {}},
        environment={"train": {"EPOCHS": "90"}, "metrics": {"PORT": ""}},
    )
    assert side.ecs.task_definition(arn) == info
    assert side.ecs.task_definition("train-2gpu:1") == info  # by family and revision, as a request names it
    more = {
        "containerOverrides": [{"name": "train", "resourceRequirements": [{"type": "GPU", "value": "4"}]}]
    }
    assert side.ecs.task_definition(arn, more).gpus == 4


def test_a_task_definition_ecs_does_not_know_is_an_error(side: Side):
    side.world.register(**TRAIN)
    with pytest.raises(ClientError) as err:
        side.ecs.task_definition("no-such-family:7")
    assert err.value.response["Error"]["Code"] == "ClientException"


# -------------------------------------------------------------------------------- the largest host
def test_the_largest_active_instance_of_a_cluster_says_how_many_gpus_a_task_may_have(side: Side):
    small, big = side.world.host("g5.xlarge"), side.world.host("g5.12xlarge")
    side.world.host("m5.large", "cpu-pool")
    assert side.ecs.largest_gpus(CLUSTER) == 4
    assert side.ecs.largest_gpus(CLUSTER_ARN) == 4
    assert side.ecs.largest_gpus("cpu-pool") == 0  # instances without GPUs
    side.world.drain(big)  # a draining instance takes no new task
    assert side.ecs.largest_gpus(CLUSTER) == 1
    side.world.drain(small)
    assert side.ecs.largest_gpus(CLUSTER) is None  # no instance to take one

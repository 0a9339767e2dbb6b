"""The interruption path's ECS port (`Ecs`: adapters/ecs.py EcsAdapter), the same cases against its fake
(tests/fakes.py FakeEcs) and against the adapter on moto: a host found by its EC2 instance id in the
watched clusters, drained, its tasks desired RUNNING listed and described (more than a page of them too),
stopped, which of them have stopped, and whether a task definition asks for a GPU.

Each side has a `world` that sets up what ECS holds (clusters, container instances, task definitions,
tasks started on a chosen host, a task ECS has finished stopping): on moto through ECS's and EC2's own
calls, on the fake through its state.

What moto cannot do, so no case holds it: StopTask of a task ECS does not know (moto raises a bare
Exception where ECS answers InvalidParameterException, which the adapter takes as stopped already);
DescribeTasks scoped to its cluster (moto answers a task of any cluster); the gap between a stop and the
task's STOPPED (moto's StopTask is STOPPED at once; the cases make ECS finish a stop through the world);
ListContainerInstances' filter (moto ignores it; the adapter matches the description, so it is held);
a task's containers after the first (moto describes the first only: the cases' tasks have one)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotguard.adapters.ecs import EcsAdapter
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, MANAGED_TAG, ContainerInstanceRef, TaskInfo
from spotguard_cli.emulator.gpucluster import GpuCluster
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import AWS_ACCOUNT, AWS_REGION, FakeEcs

MANAGED = {MANAGED_TAG: "true"}
GPU_OVERRIDE = {
    "containerOverrides": [{"name": "train", "resourceRequirements": [{"type": "GPU", "value": "1"}]}]
}
UNKNOWN_TASK = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task/gpu-spot/{'f' * 32}"


def container(kind: str) -> dict[str, Any]:
    """A container asking for a GPU ("gpu"), mounting /dev/nvidia0 the old way ("devices"), or neither."""
    c: dict[str, Any] = {"name": "train", "image": "spotguard/examples-train:latest", "memory": 32}
    if kind == "gpu":
        c["resourceRequirements"] = [{"type": "GPU", "value": "1"}]
    elif kind == "devices":
        c["linuxParameters"] = {"devices": [{"hostPath": "/dev/nvidia0"}]}
    return c


class MotoWorld:
    """ECS and EC2 in moto: clusters of simulated GPU instances (the emulator's GpuCluster)."""

    def __init__(self, ecs: Any, ec2: Any) -> None:
        self.ecs, self.ec2 = ecs, ec2
        self.clusters: dict[str, GpuCluster] = {}

    def host(self, cluster: str = "gpu-spot") -> ContainerInstanceRef:
        if cluster not in self.clusters:
            self.clusters[cluster] = GpuCluster(self.ecs, self.ec2, name=cluster)
        c = self.clusters[cluster]
        h = c.add_host()
        return ContainerInstanceRef(
            cluster_arn=c.arn, container_instance_arn=h.container_instance_arn, instance_id=h.instance_id
        )

    def deregister(self, ref: ContainerInstanceRef) -> None:
        self.ecs.deregister_container_instance(
            cluster=ref.cluster_arn, containerInstance=ref.container_instance_arn, force=True
        )

    def definition(self, kind: str) -> str:
        resp = self.ecs.register_task_definition(
            family=f"train-{kind}", containerDefinitions=[container(kind)]
        )
        return str(resp["taskDefinition"]["taskDefinitionArn"])

    def start(
        self,
        ref: ContainerInstanceRef,
        definition: str,
        tags: dict[str, str] | None = None,
        started_by: str = "",
        overrides: dict[str, Any] | None = None,
    ) -> str:
        resp = self.ecs.start_task(
            cluster=ref.cluster_arn,
            taskDefinition=definition,
            containerInstances=[ref.container_instance_arn],
            tags=[{"key": k, "value": v} for k, v in (tags or {}).items()],
            startedBy=started_by,
            overrides=overrides or {},
        )
        return str(resp["tasks"][0]["taskArn"])

    def finish(self, cluster_arn: str, task_arn: str) -> None:
        """ECS has stopped the task."""
        self.ecs.stop_task(cluster=cluster_arn, task=task_arn, reason="exited")


class FakeWorld:
    """The same world in the fake's state, each task as ECS would describe it to the adapter."""

    def __init__(self, fake: FakeEcs) -> None:
        self.fake = fake
        self.ids = itertools.count(1)

    def host(self, cluster: str = "gpu-spot") -> ContainerInstanceRef:
        n = next(self.ids)
        ref = ContainerInstanceRef(
            cluster_arn=f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:cluster/{cluster}",
            container_instance_arn=f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:container-instance/{cluster}/{n:032x}",
            instance_id=f"i-{n:017x}",
        )
        self.fake.hosts[ref.instance_id] = ref
        return ref

    def deregister(self, ref: ContainerInstanceRef) -> None:
        del self.fake.hosts[ref.instance_id]

    def definition(self, kind: str) -> str:
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task-definition/train-{kind}:{next(self.ids)}"
        self.fake.definitions[arn] = kind in ("gpu", "devices")
        return arn

    def start(
        self,
        ref: ContainerInstanceRef,
        definition: str,
        tags: dict[str, str] | None = None,
        started_by: str = "",
        overrides: dict[str, Any] | None = None,
    ) -> str:
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task/{ref.cluster_name}/{next(self.ids):032x}"
        self.fake.tasks[arn] = TaskInfo(
            task_arn=arn,
            cluster_arn=ref.cluster_arn,
            task_definition_arn=definition,
            container_instance_arn=ref.container_instance_arn,
            started_by=started_by,
            tags=tags or {},
            last_status="RUNNING",
            desired_status="RUNNING",
            containers=(("train", None),),
            gpu=True if overrides else None,
        )
        return arn

    def finish(self, cluster_arn: str, task_arn: str) -> None:
        self.fake.stopped_arns.add(task_arn)
        self.fake.tasks[task_arn] = self.fake.tasks[task_arn].model_copy(
            update={"desired_status": "STOPPED", "last_status": "STOPPED"}
        )


@dataclass
class Side:
    name: str
    ecs: Any  # EcsAdapter | FakeEcs
    world: Any  # MotoWorld | FakeWorld


def fake_side() -> Side:
    fake = FakeEcs()
    return Side("fake", fake, FakeWorld(fake))


def moto_side(aws: Clients) -> Side:
    return Side("moto", EcsAdapter(aws["ecs"]), MotoWorld(aws["ecs"], aws["ec2"]))


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("ecs", "ec2"), fake_side, moto_side)


def expected(ref: ContainerInstanceRef, arn: str, definition: str, **kw: Any) -> TaskInfo:
    """A running task as the interruption path reads it."""
    base: dict[str, Any] = {
        "task_arn": arn,
        "cluster_arn": ref.cluster_arn,
        "task_definition_arn": definition,
        "container_instance_arn": ref.container_instance_arn,
        "last_status": "RUNNING",
        "desired_status": "RUNNING",
        "containers": (("train", None),),
    }
    return TaskInfo(**{**base, **kw})


# ---------------------------------------------------------------------------------- finding a host
def test_a_host_is_found_by_its_instance_id_in_the_watched_clusters(side: Side):
    a, b = side.world.host("gpu-spot"), side.world.host("cpu-pool")
    assert side.ecs.find_container_instance(a.instance_id, ["gpu-spot"]) == a
    assert side.ecs.find_container_instance(a.instance_id, [a.cluster_arn]) == a  # by ARN too
    assert side.ecs.find_container_instance(b.instance_id, ["gpu-spot"]) is None  # not a watched cluster
    assert side.ecs.find_container_instance(b.instance_id, ["gpu-spot", "cpu-pool"]) == b
    assert side.ecs.find_container_instance(b.instance_id, []) == b  # none named: every cluster


def test_an_instance_that_is_no_container_instance_is_not_found(side: Side):
    a = side.world.host()
    assert side.ecs.find_container_instance("i-0123456789abcdef0", ["gpu-spot"]) is None
    assert side.ecs.find_container_instance(a.instance_id, ["gpu-spot"]) == a


# ------------------------------------------------------------------------------------------- drain
def test_a_drained_host_is_draining_and_no_other(side: Side):
    a, b = side.world.host(), side.world.host()
    side.ecs.drain(a)
    assert side.ecs.find_container_instance(a.instance_id, ["gpu-spot"]).status == "DRAINING"
    assert side.ecs.find_container_instance(b.instance_id, ["gpu-spot"]).status == "ACTIVE"


def test_draining_a_host_ecs_no_longer_knows_is_no_error(side: Side):
    gone, here = side.world.host(), side.world.host()
    side.world.deregister(gone)
    side.ecs.drain(gone)  # deregistered already: nothing left to drain
    side.ecs.drain(here)
    assert side.ecs.find_container_instance(gone.instance_id, ["gpu-spot"]) is None
    assert side.ecs.find_container_instance(here.instance_id, ["gpu-spot"]).status == "DRAINING"


# -------------------------------------------------------------------------------- a host's tasks
def test_the_tasks_desired_running_on_a_host_are_listed(side: Side):
    a, b = side.world.host(), side.world.host()
    td = side.world.definition("gpu")
    on_a = [side.world.start(a, td, MANAGED) for _ in range(3)]
    on_b = side.world.start(b, td, MANAGED)
    side.ecs.stop_task(a.cluster_arn, on_a[0], "SpotGuard: moved")
    assert sorted(side.ecs.running_task_arns(a)) == sorted(on_a[1:])
    assert side.ecs.running_task_arns(b) == [on_b]


def test_tasks_are_described_as_the_interruption_path_reads_them(side: Side):
    a = side.world.host()
    td = side.world.definition("gpu")
    tags = {**MANAGED, CHECKPOINT_CONTAINER_TAG: "train", "team": "vision"}
    mine = side.world.start(a, td, tags, started_by="spotguard/j1/1")
    theirs = side.world.start(a, td, overrides=GPU_OVERRIDE)  # not managed; a GPU it asked for itself
    got = {t.task_arn: t for t in side.ecs.describe_tasks(a.cluster_arn, [mine, theirs, UNKNOWN_TASK])}
    assert got == {
        mine: expected(a, mine, td, started_by="spotguard/j1/1", tags=tags),
        theirs: expected(a, theirs, td, gpu=True),
    }
    assert got[mine].started_by_spotguard and got[mine].checkpoint_container == "train"


def test_a_host_with_more_than_a_page_of_tasks_has_them_all_listed_and_described(side: Side):
    a = side.world.host()
    td = side.world.definition("gpu")
    arns = [side.world.start(a, td, MANAGED) for _ in range(101)]  # ListTasks and DescribeTasks: 100 a call
    listed = side.ecs.running_task_arns(a)
    assert sorted(listed) == sorted(arns)
    assert sorted(t.task_arn for t in side.ecs.describe_tasks(a.cluster_arn, listed)) == sorted(arns)
    assert side.ecs.stopped(a.cluster_arn, listed) == []


# ------------------------------------------------------------------------------------ stopping
def test_a_task_asked_to_stop_is_no_longer_desired_running(side: Side):
    a = side.world.host()
    td = side.world.definition("gpu")
    arn, other = side.world.start(a, td, MANAGED), side.world.start(a, td, MANAGED)
    side.ecs.stop_task(a.cluster_arn, arn, "SpotGuard: spot interruption of i-0123 (event e-1)")
    side.ecs.stop_task(a.cluster_arn, arn, "SpotGuard: again")  # a repeated stop is no error
    (described,) = side.ecs.describe_tasks(a.cluster_arn, [arn])
    assert described.desired_status == "STOPPED"
    assert side.ecs.running_task_arns(a) == [other]


def test_stopped_names_the_tasks_that_have_stopped_or_that_ecs_forgot(side: Side):
    a = side.world.host()
    td = side.world.definition("gpu")
    running, done = side.world.start(a, td, MANAGED), side.world.start(a, td, MANAGED)
    side.world.finish(a.cluster_arn, done)
    assert side.ecs.stopped(a.cluster_arn, [running, done, UNKNOWN_TASK]) == [done, UNKNOWN_TASK]


# --------------------------------------------------------------------------- task definitions
def test_a_definition_asks_for_a_gpu_by_a_requirement_or_by_its_devices(side: Side):
    gpu, devices, cpu = (side.world.definition(kind) for kind in ("gpu", "devices", "cpu"))
    assert side.ecs.definition_has_gpu(gpu) is True
    assert side.ecs.definition_has_gpu(devices) is True
    assert side.ecs.definition_has_gpu(cpu) is False
    assert side.ecs.definition_has_gpu(gpu) is True  # asked again (the adapter keeps the answer)


def test_a_definition_ecs_does_not_know_is_an_error(side: Side):
    side.world.definition("gpu")
    with pytest.raises(ClientError) as err:
        side.ecs.definition_has_gpu(f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task-definition/nope:1")
    assert err.value.response["Error"]["Code"] == "ClientException"

"""The local stack's boot model (cli/spotguard_cli/emulator/boot.py) on moto in this process: instances
from the pools' Auto Scaling groups join after their boot, leave with their group, and a RunTask that no
instance fits waits PROVISIONING while managed scaling adds one; without it, RunTask answers as before."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from moto.autoscaling.models import FakeAutoScalingGroup

from spotguard.adapters import clients
from spotguard_cli.emulator import motopatch
from spotguard_cli.emulator.boot import BootModel
from spotguard_cli.emulator.gpucluster import GpuCluster, PoolGroup
from spotguard_cli.emulator.gpuscheduler import GpuScheduler, TaskStates

from .conftest import fresh_aws

POOLS = [
    PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
    PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
]
BOOT, SCALE_OUT = 180.0, 60.0


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def forward(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Local:
    """A cluster of the two pools, ECS placement played by GpuScheduler, SpotGuard's own clients (whose
    calls the hooks see), and, with `boot`, the boot model."""

    def __init__(self, boot: bool) -> None:
        import boto3

        self.ecs, ec2, self.asg = (
            boto3.client(s, region_name="us-east-1") for s in ("ecs", "ec2", "autoscaling")
        )
        self.ec2 = ec2
        self.cluster = GpuCluster(self.ecs, ec2, "gpu-spot")
        self.cluster.add_pools(self.asg, POOLS)
        self.td = self.cluster.gpu_task_definition()
        clients.reset()
        self.scheduler = GpuScheduler(self.cluster)
        self.scheduler.install()
        self.clock = Clock()
        self.model: BootModel | None = None
        if boot:
            self.model = BootModel(
                self.cluster,
                self.scheduler,
                self.asg,
                POOLS,
                self.clock,
                boot_seconds=BOOT,
                scale_out_seconds=SCALE_OUT,
            )
            self.model.install()
            self.scheduler.manage_scaling(TaskStates(None, "us-east-1"), self.model.wanted)
        self.spotguard_asg = clients.client("autoscaling")  # SpotGuard's: the functions' calls
        self.spotguard_ecs = clients.client("ecs")

    def group(self, name: str) -> dict[str, Any]:
        return self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]

    def registered(self) -> list[str]:
        arns = self.ecs.list_container_instances(cluster="gpu-spot")["containerInstanceArns"]
        if not arns:
            return []
        found = self.ecs.describe_container_instances(cluster="gpu-spot", containerInstances=arns)
        return sorted(ci["ec2InstanceId"] for ci in found["containerInstances"])

    def run_task(self, provider: str = "gpu-spot-b") -> dict[str, Any]:
        return dict(
            self.spotguard_ecs.run_task(
                cluster="gpu-spot",
                taskDefinition=self.td,
                capacityProviderStrategy=[{"capacityProvider": provider, "weight": 1}],
                startedBy="spotguard/job/2",
            )
        )


@pytest.fixture
def boot_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # the groups launch their MixedInstancesPolicy's type, as spot (what moto server gets in motopatch.main)
    original = FakeAutoScalingGroup.replace_autoscaling_group_instances
    monkeypatch.setattr(
        FakeAutoScalingGroup, "replace_autoscaling_group_instances", motopatch.launched_as_pools(original)
    )
    with fresh_aws():  # moto in this process, tasks held, and every call held to its role
        yield


@pytest.fixture
def local(boot_aws: None) -> Local:
    return Local(boot=True)


@pytest.fixture
def plain(boot_aws: None) -> Local:
    return Local(boot=False)


def test_a_raised_desired_capacity_joins_after_the_boot_not_before(local: Local) -> None:
    assert local.model is not None
    local.spotguard_asg.set_desired_capacity(
        AutoScalingGroupName="gpu-spot-b-group", DesiredCapacity=1, HonorCooldown=False
    )
    (instance,) = [i["InstanceId"] for i in local.group("gpu-spot-b-group")["Instances"]]
    assert list(local.model.booting) == [instance]

    local.clock.forward(BOOT - 1)
    assert local.model.advance() == ([], [])
    assert local.registered() == [] and local.cluster.hosts == []

    local.clock.forward(1)
    joined, gone = local.model.advance()
    assert [(h.instance_id, h.capacity_provider, h.availability_zone) for h, _ in joined] == [
        (instance, "gpu-spot-b", "us-east-1b")
    ]
    assert gone == [] and local.registered() == [instance]  # the group's own instance, in ECS
    (ec2,) = local.ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"]
    assert (ec2["InstanceType"], ec2.get("InstanceLifecycle")) == ("g5.xlarge", "spot")
    assert joined[0][1].why == "SpotGuard" and local.model.booting == {}


def test_terminate_removes_a_booting_instance_and_a_joined_one(local: Local) -> None:
    assert local.model is not None
    local.spotguard_asg.set_desired_capacity(
        AutoScalingGroupName="gpu-spot-a-group", DesiredCapacity=2, HonorCooldown=False
    )
    first, second = sorted(local.model.booting)
    local.clock.forward(BOOT)
    joined, _ = local.model.advance()
    assert sorted(h.instance_id for h, _ in joined) == [first, second]
    local.spotguard_asg.set_desired_capacity(
        AutoScalingGroupName="gpu-spot-a-group", DesiredCapacity=3, HonorCooldown=False
    )
    (third,) = local.model.booting

    local.spotguard_asg.terminate_instance_in_auto_scaling_group(
        InstanceId=third, ShouldDecrementDesiredCapacity=True
    )
    local.spotguard_asg.terminate_instance_in_auto_scaling_group(
        InstanceId=first, ShouldDecrementDesiredCapacity=True
    )
    local.clock.forward(BOOT)
    joined, gone = local.model.advance()
    assert joined == [] and [h.instance_id for h in gone] == [first]  # the booting one never joins
    assert local.group("gpu-spot-a-group")["DesiredCapacity"] == 1
    assert {iid for _, iid, _ in local.model.left} == {first, third}


def test_an_unplaced_runtask_waits_provisioning_while_managed_scaling_adds_an_instance(local: Local) -> None:
    assert local.model is not None
    answer = local.run_task()
    assert answer["failures"] == []
    (task,) = answer["tasks"]
    assert task["lastStatus"] == "PROVISIONING" and not task.get("containerInstanceArn")
    assert local.scheduler.is_waiting(task["taskArn"])

    local.clock.forward(SCALE_OUT - 1)
    local.model.advance()
    assert local.group("gpu-spot-b-group")["DesiredCapacity"] == 0  # the metric's period has not passed

    local.clock.forward(1)
    local.model.advance()
    assert local.group("gpu-spot-b-group")["DesiredCapacity"] == 1
    (boot,) = local.model.booting.values()
    assert boot.why == "managed scaling"
    assert local.scheduler.place_waiting() == []  # nothing has joined

    local.clock.forward(BOOT)
    (joined,), _ = local.model.advance()
    assert local.scheduler.place_waiting() == [task["taskArn"]]
    (placed,) = local.ecs.describe_tasks(cluster="gpu-spot", tasks=[task["taskArn"]])["tasks"]
    assert placed["containerInstanceArn"] == joined[0].container_instance_arn
    assert placed["lastStatus"] == "RUNNING" and not local.scheduler.is_waiting(task["taskArn"])
    assert local.cluster.describe_host(joined[0])["runningTasksCount"] == 1
    local.clock.forward(SCALE_OUT * 3)
    local.model.advance()
    assert local.group("gpu-spot-b-group")["DesiredCapacity"] == 1  # no task waits: no more instances


def test_managed_scaling_counts_an_instance_already_booting_for_the_provider(local: Local) -> None:
    assert local.model is not None
    # a spare asked for (SpotGuard's early replacement) before the task's RunTask
    local.spotguard_asg.set_desired_capacity(
        AutoScalingGroupName="gpu-spot-b-group", DesiredCapacity=1, HonorCooldown=False
    )
    local.clock.forward(30)
    first = local.run_task()["tasks"][0]["taskArn"]
    local.clock.forward(SCALE_OUT)
    local.model.advance()
    assert local.group("gpu-spot-b-group")["DesiredCapacity"] == 1  # the spare covers it
    second = local.run_task()["tasks"][0]["taskArn"]
    local.clock.forward(SCALE_OUT)
    local.model.advance()
    assert local.group("gpu-spot-b-group")["DesiredCapacity"] == 2  # one GPU each: one more
    local.clock.forward(BOOT - 2 * SCALE_OUT - 30)
    local.model.advance()
    assert local.scheduler.place_waiting() == [first]  # the spare joined: the oldest task first
    assert local.scheduler.is_waiting(second)  # its instance is still booting


def test_a_task_stopped_while_provisioning_stops_waiting(local: Local) -> None:
    arn = local.run_task()["tasks"][0]["taskArn"]
    local.spotguard_ecs.stop_task(cluster="gpu-spot", task=arn, reason="SpotGuard: provisioning timeout")
    assert not local.scheduler.is_waiting(arn)
    assert local.scheduler.take_stopped_waiting() == [(arn, "SpotGuard: provisioning timeout")]
    assert local.scheduler.take_stopped_waiting() == []


def test_without_the_boot_model_an_unplaced_runtask_fails_and_nothing_launches(plain: Local) -> None:
    answer = plain.run_task()
    assert answer["tasks"] == [] and answer["failures"] == [{"reason": "RESOURCE:GPU"}]
    assert plain.group("gpu-spot-b-group")["DesiredCapacity"] == 0
    assert plain.scheduler.waiting == {}
    plain.spotguard_asg.set_desired_capacity(
        AutoScalingGroupName="gpu-spot-b-group", DesiredCapacity=1, HonorCooldown=False
    )
    assert plain.registered() == []  # a group's instance never joins by itself, as before
    host = plain.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-spot-b")
    (task,) = plain.run_task()["tasks"]
    assert task["containerInstanceArn"] == host.container_instance_arn

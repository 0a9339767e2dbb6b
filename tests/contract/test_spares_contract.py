"""The spare capacity's contract (adapters/autoscaling.py AsgSpares: raise_one, give_back), the same cases
against its fake (tests/fakes.py FakeSpares) and against the adapter on moto (Auto Scaling, EC2 and ECS):
a raise sets a group's desired capacity one higher, unless it is at its maximum size; a give-back drains
and terminates, with the desired capacity lowered, one instance the group added since the spare was asked
for that has joined the cluster and runs no task, unless no more such instances are there than other
spares wait for; one still booting, none added yet, or one that runs a task are answered as such, each
with whether that answer is final; a group that does not exist is neither raised nor given back.

On moto a group is made from a launch template (its instances are moto's EC2 instances), an instance
joins the cluster as a container instance registered with its EC2 instance id, and a task runs on it by
StartTask there. Not covered here: a task placed on the instance between its drain and its terminate,
and a raise whose answer was lost (a failure moto cannot be made to give at that moment): the unit tests
hold those (tests/unit/test_spare_adapter.py, test_spare_leases.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from spotguard.adapters.autoscaling import AsgSpares
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import FakeGroup, FakeSpares

CLUSTER = "gpu-spot"


class FakeSide:
    name = "fake"

    def __init__(self) -> None:
        self.spares = FakeSpares()
        self._ids = 0

    def group(self, name: str, size: int, max_size: int) -> tuple[str, ...]:
        """A group of `size` instances in service; their ids, in the group's order."""
        ids = []
        for _ in range(size):
            self._ids += 1
            ids.append(f"i-{self._ids:017x}")
        self.spares.groups[name] = FakeGroup(size, max_size, dict.fromkeys(ids, "InService"))
        return tuple(ids)

    def join(self, instance: str, tasks: int = 0) -> None:
        """The instance joins the cluster, and runs `tasks` tasks."""
        self.spares.registered.setdefault(CLUSTER, {})[instance] = tasks

    def standby(self, group: str, instance: str) -> None:
        """The instance is put in standby, the group's desired capacity lowered."""
        g = self.spares.groups[group]
        g.instances[instance] = "Standby"
        g.desired -= 1

    def desired(self, group: str) -> int:
        return self.spares.groups[group].desired

    def instances(self, group: str) -> tuple[str, ...]:
        return tuple(self.spares.groups[group].instances)

    def draining(self) -> set[str]:
        return {i for cluster, i in self.spares.draining if cluster == CLUSTER}


class MotoSide:
    name = "moto"

    def __init__(self, aws: Clients) -> None:
        self.asg = aws["autoscaling"]
        self.ecs = aws["ecs"]
        ec2 = aws["ec2"]
        ec2.create_launch_template(
            LaunchTemplateName="gpu-spot-a", LaunchTemplateData={"ImageId": "ami-12c6146b"}
        )
        self.ecs.create_cluster(clusterName=CLUSTER)
        train = {"name": "train", "image": "train", "cpu": 256, "memory": 512}
        self.ecs.register_task_definition(family="train", containerDefinitions=[train])
        self.spares = AsgSpares(self.asg, self.ecs)

    def _group(self, name: str) -> dict[str, Any]:
        (g,) = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        return dict(g)

    def group(self, name: str, size: int, max_size: int) -> tuple[str, ...]:
        self.asg.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": "gpu-spot-a"},
            MinSize=0,
            MaxSize=max_size,
            DesiredCapacity=size,
            AvailabilityZones=["us-east-1a"],
        )
        return self.instances(name)

    def join(self, instance: str, tasks: int = 0) -> None:
        document = json.dumps({"instanceId": instance})
        ci = self.ecs.register_container_instance(cluster=CLUSTER, instanceIdentityDocument=document)
        arn = ci["containerInstance"]["containerInstanceArn"]
        for _ in range(tasks):
            self.ecs.start_task(cluster=CLUSTER, taskDefinition="train", containerInstances=[arn])

    def standby(self, group: str, instance: str) -> None:
        self.asg.enter_standby(
            InstanceIds=[instance], AutoScalingGroupName=group, ShouldDecrementDesiredCapacity=True
        )

    def desired(self, group: str) -> int:
        return int(self._group(group)["DesiredCapacity"])

    def instances(self, group: str) -> tuple[str, ...]:
        return tuple(i["InstanceId"] for i in self._group(group)["Instances"])

    def draining(self) -> set[str]:
        arns = self.ecs.list_container_instances(cluster=CLUSTER, status="DRAINING")["containerInstanceArns"]
        if not arns:
            return set()
        described = self.ecs.describe_container_instances(cluster=CLUSTER, containerInstances=arns)
        return {ci["ec2InstanceId"] for ci in described["containerInstances"]}


Side = FakeSide | MotoSide


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("autoscaling", "ecs", "ec2"), FakeSide, MotoSide)


# -------------------------------------------------------------------------------------------- raise
def test_a_raise_asks_the_group_for_one_instance_more(side: Side):
    (first,) = side.group("g", size=1, max_size=3)
    assert side.spares.raise_one("g") == (True, (first,), "g: desired capacity 1 -> 2")
    assert side.desired("g") == 2


def test_a_group_at_its_maximum_size_is_not_raised(side: Side):
    both = side.group("g", size=2, max_size=2)
    assert side.spares.raise_one("g") == (False, both, "g is at its maximum size (2): no spare asked")
    assert side.desired("g") == 2


def test_a_group_that_does_not_exist_is_neither_raised_nor_given_back(side: Side):
    side.group("g", size=1, max_size=3)
    assert side.spares.raise_one("nope") == (False, (), "Auto Scaling group nope not found")
    assert side.spares.give_back(CLUSTER, "nope", (), keep=0) == (
        None,
        "Auto Scaling group nope not found: nothing to give back",
        True,
    )
    assert side.desired("g") == 1


# ---------------------------------------------------------------------------------------- give back
def test_an_idle_spare_is_drained_and_terminated_with_the_desired_capacity_lowered(side: Side):
    old, spare = side.group("g", size=2, max_size=3)
    side.join(old, tasks=1)
    side.join(spare)
    assert side.spares.give_back(CLUSTER, "g", (old,), keep=0) == (
        spare,
        f"g: terminated {spare}, which ran no task",
        True,
    )
    assert side.desired("g") == 1 and side.instances("g") == (old,) and side.draining() == {spare}


def test_a_spare_that_runs_a_task_is_kept_and_that_is_final(side: Side):
    old, spare = side.group("g", size=2, max_size=3)
    side.join(spare, tasks=1)
    assert side.spares.give_back(CLUSTER, "g", (old,), keep=0) == (
        None,
        "g: 1 new instance(s) run tasks, 0 kept for other spares",
        True,
    )
    assert side.desired("g") == 2 and side.instances("g") == (old, spare) and side.draining() == set()


def test_no_instance_added_since_the_ask_is_tried_again_later(side: Side):
    old, spare = side.group("g", size=2, max_size=3)
    answer = (None, "g has listed no instance added since the spare was asked for", False)
    assert side.spares.give_back(CLUSTER, "g", (old, spare), keep=0) == answer
    side.standby("g", spare)  # listed, but not one that serves
    side.join(spare)
    assert side.spares.give_back(CLUSTER, "g", (old,), keep=0) == answer
    assert side.desired("g") == 1 and side.draining() == set()


def test_a_spare_still_booting_is_given_back_once_it_has_joined(side: Side):
    old, spare = side.group("g", size=2, max_size=3)
    booting = (None, "g: the instance added is still booting: given back once it has joined", False)
    assert side.spares.give_back(CLUSTER, "g", (old,), keep=0) == booting
    assert side.desired("g") == 2 and side.instances("g") == (old, spare)
    side.join(spare)
    terminated, _, final = side.spares.give_back(CLUSTER, "g", (old,), keep=0)
    assert (terminated, final) == (spare, True) and side.instances("g") == (old,)


def test_idle_instances_that_other_spares_wait_for_are_kept(side: Side):
    old, *new = side.group("g", size=3, max_size=3)
    for instance in new:
        side.join(instance)
    assert side.spares.give_back(CLUSTER, "g", (old,), keep=2) == (
        None,
        "g: 0 new instance(s) run tasks, 2 kept for other spares",
        False,
    )
    assert side.desired("g") == 3 and side.draining() == set()
    first = min(new)  # of two idle, the first by id goes
    assert side.spares.give_back(CLUSTER, "g", (old,), keep=1) == (
        first,
        f"g: terminated {first}, which ran no task",
        True,
    )
    assert side.desired("g") == 2 and side.draining() == {first}

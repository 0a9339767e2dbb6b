"""AsgSpares (adapters/autoscaling.py) on stand-in clients: what it terminates to give a spare back, and
what it never touches."""

from __future__ import annotations

from typing import Any

from spotguard.adapters.autoscaling import AsgSpares

CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot"


class Paginator:
    def __init__(self, arns: list[str]) -> None:
        self.arns = arns

    def paginate(self, **_: Any) -> list[dict[str, Any]]:
        return [{"containerInstanceArns": self.arns}]


class Ecs:
    """Container instances by EC2 id: (arn, tasks); `place_on_drain` puts a task on an instance the moment
    it is drained (another job's relaunch placed there between the look and the terminate)."""

    def __init__(self, instances: dict[str, int], place_on_drain: bool = False) -> None:
        self.instances = {i: (f"arn:ci/{i}", n) for i, n in instances.items()}
        self.place_on_drain = place_on_drain
        self.calls: list[tuple[str, str]] = []

    def get_paginator(self, _: str) -> Paginator:
        return Paginator([arn for arn, _ in self.instances.values()])

    def describe_container_instances(self, cluster: str, containerInstances: list[str]) -> dict[str, Any]:
        return {
            "containerInstances": [
                {
                    "containerInstanceArn": arn,
                    "ec2InstanceId": i,
                    "runningTasksCount": n,
                    "pendingTasksCount": 0,
                }
                for i, (arn, n) in self.instances.items()
                if arn in containerInstances
            ]
        }

    def update_container_instances_state(
        self, cluster: str, containerInstances: list[str], status: str
    ) -> None:
        self.calls += [(status, arn) for arn in containerInstances]
        if status == "DRAINING" and self.place_on_drain:
            for i, (arn, _) in self.instances.items():
                if arn in containerInstances:
                    self.instances[i] = (arn, 1)


class Groups:
    def __init__(self, instances: list[str]) -> None:
        self.instances = instances
        self.terminated: list[str] = []

    def describe_auto_scaling_groups(self, AutoScalingGroupNames: list[str]) -> dict[str, Any]:
        return {
            "AutoScalingGroups": [
                {
                    "DesiredCapacity": len(self.instances),
                    "MaxSize": 10,
                    "Instances": [{"InstanceId": i, "LifecycleState": "InService"} for i in self.instances],
                }
            ]
        }

    def terminate_instance_in_auto_scaling_group(
        self, InstanceId: str, ShouldDecrementDesiredCapacity: bool
    ) -> None:
        assert ShouldDecrementDesiredCapacity
        self.terminated.append(InstanceId)


def test_an_idle_registered_spare_is_drained_then_terminated_and_an_old_idle_instance_never():
    groups, ecs = Groups(["i-old", "i-new"]), Ecs({"i-old": 0, "i-new": 0})
    terminated, _, final = AsgSpares(groups, ecs).give_back(CLUSTER, "g", ("i-old",), keep=0)
    assert (terminated, final) == ("i-new", True) and groups.terminated == ["i-new"]
    assert ecs.calls == [("DRAINING", "arn:ci/i-new")]


def test_a_task_placed_on_it_between_the_look_and_the_terminate_keeps_it():
    groups, ecs = Groups(["i-new"]), Ecs({"i-new": 0}, place_on_drain=True)
    terminated, said, final = AsgSpares(groups, ecs).give_back(CLUSTER, "g", (), keep=0)
    assert terminated is None and not final and "placed on i-new meanwhile" in said
    assert groups.terminated == [] and ecs.calls == [("DRAINING", "arn:ci/i-new"), ("ACTIVE", "arn:ci/i-new")]


def test_a_booting_spare_is_terminated_first_and_busy_or_kept_ones_are_not():
    groups, ecs = Groups(["i-busy", "i-booting"]), Ecs({"i-busy": 1})
    terminated, _, _ = AsgSpares(groups, ecs).give_back(CLUSTER, "g", (), keep=0)
    assert terminated == "i-booting" and ecs.calls == []  # not registered: nothing to drain
    groups, ecs = Groups(["i-a", "i-b"]), Ecs({"i-a": 0, "i-b": 0})
    terminated, said, final = AsgSpares(groups, ecs).give_back(CLUSTER, "g", (), keep=2)
    assert terminated is None and not final and "2 kept for other spares" in said

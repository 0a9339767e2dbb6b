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


def test_a_booting_spare_is_not_terminated_and_busy_or_kept_ones_are_not():
    """Issue 45, item 4: an instance not registered yet was terminated without a drain; it could register
    and take a task between the look and the terminate. It is given back once it has joined."""
    groups, ecs = Groups(["i-busy", "i-booting"]), Ecs({"i-busy": 1})
    terminated, said, final = AsgSpares(groups, ecs).give_back(CLUSTER, "g", (), keep=0)
    assert terminated is None and not final and "still booting" in said
    assert groups.terminated == [] and ecs.calls == []
    ecs.instances["i-booting"] = ("arn:ci/i-booting", 0)  # it joined, idle: drained, then terminated
    terminated, _, final = AsgSpares(groups, ecs).give_back(CLUSTER, "g", (), keep=0)
    assert (terminated, final) == ("i-booting", True) and ecs.calls == [("DRAINING", "arn:ci/i-booting")]
    groups, ecs = Groups(["i-a", "i-b"]), Ecs({"i-a": 0, "i-b": 0})
    terminated, said, final = AsgSpares(groups, ecs).give_back(CLUSTER, "g", (), keep=2)
    assert terminated is None and not final and "2 kept for other spares" in said


class Raising(Groups):
    """A group whose SetDesiredCapacity answer is lost: after it took effect (`took`), or before."""

    def __init__(self, instances: list[str], took: bool, reread_fails: bool = False) -> None:
        super().__init__(instances)
        self.desired, self.took, self.reread_fails, self.reads = len(instances), took, reread_fails, 0

    def describe_auto_scaling_groups(self, AutoScalingGroupNames: list[str]) -> dict[str, Any]:
        self.reads += 1
        if self.reads > 1 and self.reread_fails:
            raise TimeoutError("Read timeout on endpoint URL")
        answer = super().describe_auto_scaling_groups(AutoScalingGroupNames)
        answer["AutoScalingGroups"][0]["DesiredCapacity"] = self.desired
        return answer

    def set_desired_capacity(
        self, AutoScalingGroupName: str, DesiredCapacity: int, HonorCooldown: bool
    ) -> None:
        if self.took:
            self.desired = DesiredCapacity
        raise TimeoutError("Read timeout on endpoint URL")


def test_a_raise_whose_answer_was_lost_is_told_by_the_group_read_again():
    """Issue 45, item 4: the group was raised and the spare recorded "not raised", so that instance was
    never given back. The group, read again, says what happened."""
    import pytest

    took = Raising(["i-old"], took=True)
    raised, before, said = AsgSpares(took, Ecs({})).raise_one("g")
    assert raised and before == ("i-old",) and "its answer lost" in said
    lost = Raising(["i-old"], took=False)
    with pytest.raises(TimeoutError):  # not raised: said as a failure, nothing to give back
        AsgSpares(lost, Ecs({})).raise_one("g")
    unknown = Raising(["i-old"], took=True, reread_fails=True)
    raised, before, said = AsgSpares(unknown, Ecs({})).raise_one("g")
    assert raised and before == ("i-old",) and "unknown" in said  # given back if it came

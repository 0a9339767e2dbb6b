"""Auto Scaling lifecycle hooks: keep a terminating instance alive while its tasks stop, then let it go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from spotguard.domain.interruption.notices import LifecycleRef


def _unless_gone(call: Callable[..., Any], **params: Any) -> None:
    """Make the call; an action completed already (a repeated notice) or timed out leaves nothing to
    heartbeat or complete, which is not an error."""
    try:
        call(**params)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        gone = err.get("Code") == "ValidationError" and "No active Lifecycle Action" in err.get("Message", "")
        if not gone:
            raise


class LifecycleAdapter:
    def __init__(self, client: Any) -> None:
        self.client = client

    @staticmethod
    def _action(ref: LifecycleRef, instance_id: str) -> dict[str, str]:
        return {
            "LifecycleHookName": ref.hook,
            "AutoScalingGroupName": ref.group,
            "LifecycleActionToken": ref.token,
            "InstanceId": instance_id,
        }

    def heartbeat(self, ref: LifecycleRef, instance_id: str) -> None:
        _unless_gone(self.client.record_lifecycle_action_heartbeat, **self._action(ref, instance_id))

    def complete(self, ref: LifecycleRef, instance_id: str) -> None:
        _unless_gone(
            self.client.complete_lifecycle_action,
            LifecycleActionResult="CONTINUE",
            **self._action(ref, instance_id),
        )


# ------------------------------------------------------------------------------------------- spares
ECS_DESCRIBE_LIMIT = 100  # container instances per DescribeContainerInstances
BUSY = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")  # instances that cost money and may serve


class AsgSpares:
    """The early replacement's capacity (domain.jobs.spares) from a pool's Auto Scaling group: one more
    instance asked by raising the group's desired capacity, and an unused one given back by terminating
    it with the desired capacity lowered. An instance the group adds is part of the group, so of the
    pool's capacity provider: the next attempt's RunTask, with that provider, lands on it. (EC2
    CreateFleet would launch an instance outside the group, which no capacity provider places on.)"""

    def __init__(self, autoscaling: Any, ecs: Any) -> None:
        self.autoscaling, self.ecs = autoscaling, ecs

    def _group(self, name: str) -> dict[str, Any] | None:
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        found = groups.get("AutoScalingGroups") or []
        return found[0] if found else None

    def raise_one(self, group: str) -> tuple[bool, tuple[str, ...], str]:
        """One instance more in `group`: (raised, the group's instances before, what was done). A group
        at its maximum size is not raised (its owner's bound stands)."""
        g = self._group(group)
        if g is None:
            return False, (), f"Auto Scaling group {group} not found"
        before = tuple(i["InstanceId"] for i in g.get("Instances") or [])
        desired, most = int(g.get("DesiredCapacity", 0)), int(g.get("MaxSize", 0))
        if desired >= most:
            return False, before, f"{group} is at its maximum size ({most}): no spare asked"
        asked = f"{group}: desired capacity {desired} -> {desired + 1}"
        try:
            self.autoscaling.set_desired_capacity(
                AutoScalingGroupName=group, DesiredCapacity=desired + 1, HonorCooldown=False
            )
        except Exception as exc:
            # its answer may be lost after it took effect (a read timeout): the group, read again, says
            # whether it did. One that cannot be read either is taken as raised, so that its instance, if
            # it came, is given back (only an idle one the group added since `before` is ever terminated)
            said = " ".join(f"{type(exc).__name__}: {exc}".split())[:120]
            try:
                after = self._group(group)
            except Exception:
                return True, before, f"{asked}? ({said}; unknown)"
            if after is not None and int(after.get("DesiredCapacity", 0)) >= desired + 1:
                return True, before, f"{asked} (its answer lost)"
            raise
        return True, before, asked

    def give_back(
        self, cluster: str, group: str, before: tuple[str, ...], keep: int
    ) -> tuple[str | None, str, bool]:
        """Terminate (lowering the desired capacity) one instance the group added since `before` that
        runs no task, unless no more than `keep` such instances are there (other jobs' spares still
        wait for theirs). (the instance terminated or None, what was done, whether that is final: not
        when the group has listed no new instance yet, or keeps the idle ones for other spares)."""
        g = self._group(group)
        if g is None:
            return None, f"Auto Scaling group {group} not found: nothing to give back", True
        known = set(before)
        new = [
            i["InstanceId"]
            for i in g.get("Instances") or []
            if i["InstanceId"] not in known and i.get("LifecycleState") in BUSY
        ]
        if not new:
            return None, f"{group} has listed no instance added since the spare was asked for", False
        registered = self._registered(cluster, new)
        tasks = {i: n for i, (_, n) in registered.items()}
        idle = [i for i in new if tasks.get(i, 0) == 0]
        if len(idle) <= keep:
            busy = len(new) - len(idle)
            said = f"{group}: {busy} new instance(s) run tasks, {len(idle)} kept for other spares"
            return None, said, not idle  # none idle: the spare is in use; else wait for the others
        # Only a registered instance is given back, drained first so that ECS places nothing more on it,
        # then looked at again: a task placed on it since (another job's relaunch) keeps it, and it is
        # made ACTIVE again. One still booting is not terminated: it could register and take a task
        # between this look and the terminate, which nothing would drain; it is given back once it joined.
        ready = [i for i in idle if i in registered]
        if not ready:
            return None, f"{group}: the instance added is still booting: given back once it has joined", False
        instance = sorted(ready)[0]
        arn = registered[instance][0]
        self._set_state(cluster, arn, "DRAINING")
        if self._registered(cluster, [instance]).get(instance, (arn, 0))[1] > 0:
            self._set_state(cluster, arn, "ACTIVE")
            return None, f"{group}: a task was placed on {instance} meanwhile: kept", False
        self.autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=instance, ShouldDecrementDesiredCapacity=True
        )
        return instance, f"{group}: terminated {instance}, which ran no task", True

    def _set_state(self, cluster: str, container_instance_arn: str, status: str) -> None:
        self.ecs.update_container_instances_state(
            cluster=cluster, containerInstances=[container_instance_arn], status=status
        )

    def _registered(self, cluster: str, instances: list[str]) -> dict[str, tuple[str, int]]:
        """Per EC2 instance registered in the cluster: its container instance and its running and
        pending tasks (an instance that is not registered yet is absent)."""
        wanted = set(instances)
        arns: list[str] = []
        paginator = self.ecs.get_paginator("list_container_instances")
        query = f"ec2InstanceId in [{', '.join(instances)}]"
        for page in paginator.paginate(cluster=cluster, filter=query):
            arns += page.get("containerInstanceArns") or []
        counts: dict[str, tuple[str, int]] = {}
        for i in range(0, len(arns), ECS_DESCRIBE_LIMIT):
            resp = self.ecs.describe_container_instances(
                cluster=cluster, containerInstances=arns[i : i + ECS_DESCRIBE_LIMIT]
            )
            for ci in resp.get("containerInstances") or []:
                ec2 = ci.get("ec2InstanceId")
                if ec2 in wanted:  # moto ignores the filter: keep only the instances asked about
                    n = int(ci.get("runningTasksCount", 0)) + int(ci.get("pendingTasksCount", 0))
                    counts[ec2] = (str(ci["containerInstanceArn"]), n)
        return counts

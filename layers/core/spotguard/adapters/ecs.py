"""ECS for the interruption path: container instances, their tasks, drain and stop. Turns boto3 answers
into domain types. What only the jobs path needs (RunTask, task descriptions as TaskEvents, task
definitions) is in ecs_jobs.py, so the urgent function does not load the jobs domain at cold start."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from spotguard.domain.tasks import (
    ContainerInstanceRef,
    TaskInfo,
    cluster_arn_of,
    container_overrides_have_gpu,
    task_definition_has_gpu,
)

if TYPE_CHECKING:  # the pools' domain is loaded by the rebalance path only, not at a cold start
    from spotguard.domain.pools import HostPlacement

PAGE = 100  # ListTasks, DescribeTasks and DescribeContainerInstances take at most 100 at a time


def chunks(items: Sequence[str], size: int = PAGE) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


def task_info(task: dict[str, Any]) -> TaskInfo:
    """A described task as the interruption path sees it: GPU when it shows assigned GPUs or a GPU
    override (else its definition is asked, once per revision). Lenient on purpose: the urgent path
    reads what it needs and never rejects a task for a field it does not use."""
    containers = task.get("containers") or []
    gpu: bool | None = None
    if any(c.get("gpuIds") for c in containers) or container_overrides_have_gpu(task.get("overrides")):
        gpu = True
    return TaskInfo(
        task_arn=task["taskArn"],
        cluster_arn=task["clusterArn"],
        task_definition_arn=task.get("taskDefinitionArn", ""),
        container_instance_arn=task.get("containerInstanceArn"),
        started_by=task.get("startedBy", "") or "",
        tags={t["key"]: t.get("value", "") for t in task.get("tags") or [] if "key" in t},
        last_status=task.get("lastStatus", ""),
        desired_status=task.get("desiredStatus", ""),
        containers=tuple((c.get("name", ""), c.get("runtimeId")) for c in containers),
        gpu=gpu,
    )


class EcsAdapter:
    def __init__(self, client: Any) -> None:
        self.client = client
        self._gpu_by_definition: dict[str, bool] = {}  # task definition revisions never change
        self._lock = threading.Lock()

    def find_container_instance(
        self, instance_id: str, clusters: Sequence[str]
    ) -> ContainerInstanceRef | None:
        """The fallback when the index has no entry: one lookup per watched cluster."""
        names = list(clusters) or self._all_clusters()
        for cluster in names:
            arns: list[str] = []
            pages = self.client.get_paginator("list_container_instances").paginate(
                cluster=cluster, filter=f"ec2InstanceId == {instance_id}"
            )
            for page in pages:
                arns += page.get("containerInstanceArns", [])
            # The filter is honoured by ECS but not by every stand-in: match on the description too.
            for chunk in chunks(arns):
                resp = self.client.describe_container_instances(cluster=cluster, containerInstances=chunk)
                for ci in resp.get("containerInstances", []):
                    if ci.get("ec2InstanceId") == instance_id:
                        return ContainerInstanceRef(
                            cluster_arn=ci.get("clusterArn")
                            or cluster_arn_of(ci["containerInstanceArn"])
                            or cluster,
                            container_instance_arn=ci["containerInstanceArn"],
                            instance_id=instance_id,
                            status=ci.get("status", "ACTIVE"),
                        )
        return None

    def placement(self, ref: ContainerInstanceRef) -> HostPlacement | None:
        """Where the host is (its capacity provider, instance type and zone), from one
        DescribeContainerInstances; None when ECS no longer knows it. For the pool a rebalance
        recommendation is about: off the urgent path, and domain.pools is loaded only here."""
        from spotguard.domain.pools import HostPlacement

        resp = self.client.describe_container_instances(
            cluster=ref.cluster_arn, containerInstances=[ref.container_instance_arn]
        )
        found = resp.get("containerInstances") or []
        if not found:
            return None
        ci = found[0]
        attrs = {a.get("name"): a.get("value") for a in ci.get("attributes") or []}
        return HostPlacement(
            cluster=ref.cluster_name,
            capacity_provider=ci.get("capacityProviderName") or None,
            instance_type=attrs.get("ecs.instance-type") or None,
            availability_zone=attrs.get("ecs.availability-zone") or None,
        )

    def _all_clusters(self) -> list[str]:
        arns: list[str] = []
        for page in self.client.get_paginator("list_clusters").paginate():
            arns += page.get("clusterArns", [])
        return arns

    def drain(self, ref: ContainerInstanceRef) -> None:
        resp = self.client.update_container_instances_state(
            cluster=ref.cluster_arn, containerInstances=[ref.container_instance_arn], status="DRAINING"
        )
        failures = [f for f in resp.get("failures", []) if f.get("reason") != "MISSING"]
        if failures:  # MISSING: deregistered already, nothing left to drain
            raise RuntimeError(f"drain {ref.container_instance_arn} failed: {failures[0].get('reason')}")

    def running_task_arns(self, ref: ContainerInstanceRef) -> list[str]:
        """The tasks desired RUNNING on a host: one ListTasks call per 100."""
        arns: list[str] = []
        pages = self.client.get_paginator("list_tasks").paginate(
            cluster=ref.cluster_arn,
            containerInstance=ref.container_instance_arn,
            desiredStatus="RUNNING",
            PaginationConfig={"PageSize": PAGE},
        )
        for page in pages:
            arns += page.get("taskArns", [])
        return arns

    def describe_tasks(self, cluster_arn: str, arns: Sequence[str]) -> list[TaskInfo]:
        """With tags: one DescribeTasks call per 100."""
        out: list[TaskInfo] = []
        for chunk in chunks(arns):
            resp = self.client.describe_tasks(cluster=cluster_arn, tasks=chunk, include=["TAGS"])
            out += [task_info(t) for t in resp.get("tasks", [])]
        return out

    def stopped(self, cluster_arn: str, task_arns: Sequence[str]) -> list[str]:
        """Which of these tasks have stopped (or are gone)."""
        seen: dict[str, str] = {}
        for chunk in chunks(task_arns):
            resp = self.client.describe_tasks(cluster=cluster_arn, tasks=chunk)
            seen.update({t["taskArn"]: t.get("lastStatus", "") for t in resp.get("tasks", [])})
        return [a for a in task_arns if seen.get(a, "STOPPED") == "STOPPED"]

    def definition_has_gpu(self, task_definition_arn: str) -> bool:
        with self._lock:
            if task_definition_arn in self._gpu_by_definition:
                return self._gpu_by_definition[task_definition_arn]
        resp = self.client.describe_task_definition(taskDefinition=task_definition_arn)
        gpu = task_definition_has_gpu(resp["taskDefinition"])
        with self._lock:
            self._gpu_by_definition[task_definition_arn] = gpu
        return gpu

    def stop_task(self, cluster: str, task_arn: str, reason: str) -> None:
        """StopTask (SIGTERM, then SIGKILL after the container's stopTimeout). A task ECS no longer knows
        (InvalidParameterException) is stopped already, which is what was asked; other errors raise."""
        try:
            self.client.stop_task(cluster=cluster, task=task_arn, reason=reason)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidParameterException":
                raise

"""ECS tasks and container instances as SpotGuard sees them, and which tasks it manages. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MANAGED_TAG = "spotguard:managed"
JOB_TAG = "spotguard:job-id"
STARTED_BY = "spotguard"
CHECKPOINT_CONTAINER_TAG = "spotguard:checkpoint-container"


def cluster_arn_of(container_instance_arn: str) -> str | None:
    """arn:aws:ecs:REGION:ACCOUNT:container-instance/CLUSTER/ID -> the cluster's ARN (None for the
    old ARN format, which does not name the cluster)."""
    head, _, rest = container_instance_arn.partition(":container-instance/")
    return f"{head}:cluster/{rest.split('/')[0]}" if head and "/" in rest else None


class ManageMode(StrEnum):
    TAGGED = "tagged"  # tasks SpotGuard started, or tagged spotguard:managed=true
    ALL_GPU = "all-gpu"  # and every GPU task in the watched clusters


class ContainerInstanceRef(BaseModel):
    model_config = ConfigDict(frozen=True)
    cluster_arn: str
    container_instance_arn: str
    instance_id: str
    status: str = "ACTIVE"

    @property
    def cluster_name(self) -> str:
        return self.cluster_arn.rsplit("/", 1)[-1]


class TaskInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    task_arn: str
    cluster_arn: str
    task_definition_arn: str
    container_instance_arn: str | None = None
    started_by: str = ""
    tags: Mapping[str, str] = Field(default_factory=dict)
    last_status: str = ""
    desired_status: str = ""
    containers: tuple[tuple[str, str | None], ...] = ()  # (name, docker runtime id if known), in order
    # True when the task itself shows GPUs (assigned gpuIds, or a GPU override); None = ask its definition.
    gpu: bool | None = None

    @property
    def started_by_spotguard(self) -> bool:
        return (
            self.started_by == STARTED_BY
            or self.started_by.startswith(STARTED_BY + "/")
            or (JOB_TAG in self.tags)
        )

    @property
    def tagged_managed(self) -> bool:
        return self.tags.get(MANAGED_TAG, "").lower() == "true"

    @property
    def checkpoint_container(self) -> str | None:
        """The container that runs the agent and takes SIGUSR1: tag `spotguard:checkpoint-container`,
        else the first container. Never all of them: SIGUSR1 kills a process that does not handle it."""
        named = self.tags.get(CHECKPOINT_CONTAINER_TAG)
        if named:
            return named
        return self.containers[0][0] if self.containers else None


def container_overrides_have_gpu(overrides: Mapping[str, Any] | None) -> bool:
    for c in (overrides or {}).get("containerOverrides", []) or []:
        if _has_gpu_requirement(c.get("resourceRequirements")):
            return True
    return False


def task_definition_has_gpu(task_definition: Mapping[str, Any]) -> bool:
    """GPU = a GPU resource requirement, or legacy `/dev/nvidia*` device mounts."""
    for c in task_definition.get("containerDefinitions", []) or []:
        if _has_gpu_requirement(c.get("resourceRequirements")):
            return True
        devices = (c.get("linuxParameters") or {}).get("devices") or []
        if any(str(d.get("hostPath", "")).startswith("/dev/nvidia") for d in devices):
            return True
    return False


def gpu_count(task_definition: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> int:
    """GPUs a task asks for: the GPU resource requirements of its containers, overrides first."""
    overridden = {
        str(c.get("name")): c.get("resourceRequirements")
        for c in (overrides or {}).get("containerOverrides", []) or []
        if c.get("resourceRequirements") is not None
    }
    total = 0
    for c in task_definition.get("containerDefinitions", []) or []:
        reqs = overridden.get(str(c.get("name")), c.get("resourceRequirements"))
        for r in reqs or []:
            if r.get("type") == "GPU":
                try:
                    total += max(0, int(r.get("value", "0")))
                except (TypeError, ValueError):
                    continue
    return total


def _has_gpu_requirement(reqs: Iterable[Mapping[str, Any]] | None) -> bool:
    for r in reqs or []:
        if r.get("type") == "GPU":
            try:
                if int(r.get("value", "0")) > 0:
                    return True
            except (TypeError, ValueError):
                continue
    return False


def managed_tasks(
    tasks: Iterable[TaskInfo], mode: ManageMode, definition_has_gpu: Callable[[str], bool]
) -> list[TaskInfo]:
    """The tasks SpotGuard is responsible for, among those on a host."""
    chosen = []
    for t in tasks:
        if t.started_by_spotguard or t.tagged_managed:
            chosen.append(t)
        elif mode is ManageMode.ALL_GPU:
            gpu = t.gpu if t.gpu is not None else definition_has_gpu(t.task_definition_arn)
            if gpu:
                chosen.append(t)
    return chosen

"""ECS tasks and container instances as SpotGuard sees them, and which tasks it manages. Pure.

- `TaskEvent`: one ECS task as the jobs path reads it, from a Task State Change event or a DescribeTasks
  answer (the ECS adapter turns descriptions into it; `domain.jobs.task_events` parses events into it);
- `TaskInfo`: what the interruption path needs of a task on a host (built from a TaskEvent by `info`);
- `is_managed`: the one rule for which tasks SpotGuard is responsible for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MANAGED_TAG = "spotguard:managed"
JOB_TAG = "spotguard:job-id"
STARTED_BY = "spotguard"
CHECKPOINT_CONTAINER_TAG = "spotguard:checkpoint-container"
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# startedBy carries the job and the attempt, so every task event names its job without a lookup.
# node 0 (and every task of a one-node job): spotguard/<job>/<attempt>; node k of a gang: .../<attempt>/<k>
_STARTED_BY = re.compile(
    rf"^{STARTED_BY}/(?P<job>[A-Za-z0-9][A-Za-z0-9_-]{{0,63}})/(?P<attempt>\d{{1,4}})(?:/(?P<node>[1-9]\d?))?$"
)


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


class TaskEvent(BaseModel):
    """One ECS task: what the job state machine and adoption need from an ECS Task State Change event or
    a DescribeTasks answer (which share their field names; descriptions also carry tags)."""

    model_config = ConfigDict(frozen=True)
    event_id: str = ""
    task_arn: str
    cluster_arn: str
    version: int = 0
    last_status: str
    desired_status: str = ""
    started_by: str = ""
    task_definition_arn: str = ""
    container_instance_arn: str | None = None
    availability_zone: str | None = None
    capacity_provider: str | None = None
    launch_type: str | None = None
    group: str | None = None
    started_at: datetime | None = None
    stopping_at: datetime | None = None
    stopped_at: datetime | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    containers: tuple[dict[str, Any], ...] = ()
    overrides: dict[str, Any] | None = None
    enable_execute_command: bool | None = None
    time: datetime | None = None  # the event's time (None for a description)
    created_at: datetime | None = None
    platform_version: str | None = None
    subnet_id: str | None = None  # awsvpc tasks: the subnet of their network interface
    private_ip: str | None = None  # awsvpc tasks: their network interface's private address
    tags: Mapping[str, str] = Field(default_factory=dict)  # DescribeTasks with TAGS only; events have none

    @property
    def job_ref(self) -> tuple[str, int] | None:
        """(job id, attempt) when SpotGuard started this task."""
        m = _STARTED_BY.fullmatch(self.started_by)  # whole: `$` lets a trailing newline through
        return (m["job"], int(m["attempt"])) if m else None

    @property
    def node(self) -> int:
        """The task's node in its attempt's gang (0: node 0, or a one-node job's task)."""
        m = _STARTED_BY.fullmatch(self.started_by)
        return int(m["node"]) if m and m["node"] else 0

    @property
    def detail(self) -> dict[str, Any]:
        return {
            "containers": list(self.containers),
            "stopCode": self.stop_code,
            "stoppedReason": self.stopped_reason,
        }

    def info(self, gpu: bool | None = None, tags: Mapping[str, str] | None = None) -> TaskInfo:
        """The task as the interruption path sees it (with other tags, for the host's task index)."""
        return TaskInfo(
            task_arn=self.task_arn,
            cluster_arn=self.cluster_arn,
            task_definition_arn=self.task_definition_arn,
            container_instance_arn=self.container_instance_arn,
            started_by=self.started_by,
            tags=self.tags if tags is None else tags,
            last_status=self.last_status,
            desired_status=self.desired_status,
            containers=tuple((str(c.get("name", "")), c.get("runtimeId")) for c in self.containers),
            gpu=gpu,
        )


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

    def gpu(task: TaskInfo) -> bool:
        return task.gpu if task.gpu is not None else definition_has_gpu(task.task_definition_arn)

    return [t for t in tasks if is_managed(t, mode, partial(gpu, t))]


def is_managed(task: TaskInfo, mode: ManageMode, has_gpu: Callable[[], bool]) -> bool:
    """SpotGuard manages the tasks it started, the tasks tagged spotguard:managed=true and, in all-gpu
    mode, every GPU task (`has_gpu` is asked only then: it may cost a DescribeTaskDefinition)."""
    if task.started_by_spotguard or task.tagged_managed:
        return True
    return mode is ManageMode.ALL_GPU and has_gpu()

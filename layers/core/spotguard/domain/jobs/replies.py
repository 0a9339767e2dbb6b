"""What the adapters answer to the jobs use case: plain models, so ports and use cases need no adapter."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class TaskDefinitionInfo(BaseModel):
    arn: str
    containers: list[str]
    gpus: int
    environment: dict[str, dict[str, str]]  # container name -> its environment
    volumes_at_launch: list[str] = []  # volumes `configuredAtLaunch` (EBS mode)
    mounts: dict[str, dict[str, str]] = {}  # container name -> {volume name: path in the container}
    family: str = ""
    task_role_arn: str | None = None
    execution_role_arn: str | None = None
    network_mode: str | None = None  # None: ECS's default (bridge on EC2)


class RunResult(BaseModel):
    """What RunTask did: started a task, or placed none, with the class of why (domain.jobs.run_errors):
    capacity and transient failures wait and retry, access and request failures end the job."""

    task_arn: str | None = None
    failure: Literal["capacity", "transient", "access", "request"] | None = None
    reason: str = ""


class HostInfo(BaseModel):
    instance_id: str
    instance_type: str | None = None
    availability_zone: str | None = None
    lifecycle: str | None = None  # spot | on-demand
    instance_price: float | None = None  # USD per hour for the whole instance
    instance_gpus: int | None = None
    private_ip: str | None = None  # where a gang's other nodes find node 0 (bridge and host networking)


class Notification(BaseModel):
    """One notification: `id` is stable, so a consumer can drop a repeated one."""

    id: str
    kind: str  # a key of adapters.notify.DETAIL_TYPES
    job_id: str
    message: str
    detail: dict[str, Any]

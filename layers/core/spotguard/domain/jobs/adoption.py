"""Adoption: a task SpotGuard did not start, tagged spotguard:managed=true, becomes a job. Pure.

Its RunTask request is rebuilt from the task's description (DescribeTasks with tags) and the stack's
network defaults; `adopted_job` makes the job, with the task as its first attempt. What a description
does not hold cannot be rebuilt (docs/jobs.md lists it): placement constraints and strategy,
propagateTags, volume configurations, the security groups of an awsvpc task, and the request's
clientToken or referenceId.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from spotguard.domain.jobs.model import SPOTGUARD_ENV, Attempt, Job, JobState, adopted_job_id, revised
from spotguard.domain.jobs.replies import TaskDefinitionInfo
from spotguard.domain.jobs.stops import classify_stop
from spotguard.domain.jobs.submission import ATTEMPT_TAG, JobOptions, RunTaskRequest
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, JOB_TAG, TaskEvent

# Container override fields a description gives back that RunTask takes again.
_CONTAINER_OVERRIDE_FIELDS = (
    "name",
    "command",
    "environment",
    "environmentFiles",
    "cpu",
    "memory",
    "memoryReservation",
    "resourceRequirements",
)
_TASK_OVERRIDE_FIELDS = ("cpu", "memory", "taskRoleArn", "executionRoleArn", "ephemeralStorage")


def adopted_job(
    task: TaskEvent,
    td: TaskDefinitionInfo,
    checkpoint_uri: str,
    now: datetime,
    subnets: Sequence[str] = (),
    security_groups: Sequence[str] = (),
) -> Job:
    """The job an adopted task becomes: running with the task as attempt 1, or, for a stopped task (a
    manual resubmit of it), finished as the task did so that the resubmit starts it again."""
    stopped = task.last_status == "STOPPED"
    attempt = Attempt(
        number=1,
        task_arn=task.task_arn,
        launched_at=task.created_at or now,
        last_status=task.last_status or "PROVISIONING",
        started_at=task.started_at,
        stopped_at=task.stopped_at,
        stop_code=task.stop_code,
        stopped_reason=task.stopped_reason,
        container_instance_arn=task.container_instance_arn,
        availability_zone=task.availability_zone,
    )
    state = JobState.RUNNING
    if stopped:
        verdict = classify_stop(task.detail, None, td.containers[0] if td.containers else None)
        attempt = revised(attempt, outcome=verdict.outcome, outcome_reason=verdict.reason)
        state = JobState.SUCCEEDED if attempt.outcome == "succeeded" else JobState.FAILED
    return Job(
        job_id=adopted_job_id(task.task_arn),
        state=state,
        request=rebuild_request(task, subnets, security_groups),
        options=JobOptions(checkpoint_container=task.tags.get(CHECKPOINT_CONTAINER_TAG) or None),
        checkpoint_uri=checkpoint_uri,
        gpus=td.gpus,
        containers=td.containers,
        created_at=now,
        updated_at=now,
        origin="adopted",
        attempts=[attempt],
        last_reason="adopted" + (f"; its task had stopped: {attempt.outcome_reason}" if stopped else ""),
    )


def rebuild_request(
    task: TaskEvent, subnets: Sequence[str] = (), security_groups: Sequence[str] = ()
) -> RunTaskRequest:
    overrides = _overrides(task.overrides or {})
    request: dict[str, Any] = {"cluster": task.cluster_arn, "taskDefinition": task.task_definition_arn}
    if overrides:
        request["overrides"] = overrides
    provider = task.capacity_provider
    if provider:
        request["capacityProviderStrategy"] = [{"capacityProvider": provider}]
    elif task.launch_type:
        request["launchType"] = task.launch_type
    fargate = task.launch_type == "FARGATE" or str(provider).startswith("FARGATE")
    if task.platform_version and fargate:
        request["platformVersion"] = task.platform_version
    if task.group:
        request["group"] = task.group
    if task.enable_execute_command is not None:
        request["enableExecuteCommand"] = bool(task.enable_execute_command)
    tags = [
        {"key": key, "value": value}
        for key, value in task.tags.items()
        if not key.startswith("aws:") and key not in (JOB_TAG, ATTEMPT_TAG, CHECKPOINT_CONTAINER_TAG)
    ]
    if tags:
        request["tags"] = tags
    network = _network(task, subnets, security_groups)
    if network:
        request["networkConfiguration"] = network
    return RunTaskRequest.model_validate(request)


def _overrides(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: raw[k] for k in _TASK_OVERRIDE_FIELDS if raw.get(k) is not None}
    containers = []
    for c in raw.get("containerOverrides") or []:
        kept = {k: c[k] for k in _CONTAINER_OVERRIDE_FIELDS if c.get(k) is not None}
        if "environment" in kept:
            kept["environment"] = [e for e in kept["environment"] if e.get("name") not in SPOTGUARD_ENV]
        if len(kept) > 1:  # more than the name
            containers.append(kept)
    if containers:
        out["containerOverrides"] = containers
    return out


def _network(task: TaskEvent, subnets: Sequence[str], security_groups: Sequence[str]) -> dict[str, Any]:
    """awsvpc tasks (those with a subnet) keep it, or take the stack's subnets; their security groups
    are not in the description, so the stack's defaults (if any) are used."""
    if task.subnet_id is None:
        return {}
    chosen = list(subnets) or [task.subnet_id]
    config: dict[str, Any] = {"subnets": chosen, "assignPublicIp": "DISABLED"}
    if security_groups:
        config["securityGroups"] = list(security_groups)
    return {"awsvpcConfiguration": config}


def checkpoint_uri_of(task: TaskEvent, definition_env: Mapping[str, Mapping[str, str]]) -> str | None:
    """The task's own SPOTGUARD_CHECKPOINT_URI (an override, else its definition), if it set one."""
    for c in (task.overrides or {}).get("containerOverrides") or []:
        for e in c.get("environment") or []:
            if e.get("name") == "SPOTGUARD_CHECKPOINT_URI" and _good_uri(e.get("value")):
                return str(e["value"])
    for env in definition_env.values():
        if _good_uri(env.get("SPOTGUARD_CHECKPOINT_URI")):
            return str(env["SPOTGUARD_CHECKPOINT_URI"])
    return None


def _good_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith("s3://") and value.endswith("/") and len(value) > 6

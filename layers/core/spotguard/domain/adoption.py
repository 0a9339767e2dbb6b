"""Adoption: a task SpotGuard did not start, tagged spotguard:managed=true, becomes a job. Pure.

Its RunTask request is rebuilt from the task's description (DescribeTasks with tags) and the stack's
network defaults. What a description does not hold cannot be rebuilt (the README lists it): placement
constraints and strategy, propagateTags, volume configurations, the security groups of an awsvpc task,
and the request's clientToken or referenceId.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spotguard.domain.jobs import ATTEMPT_TAG, SPOTGUARD_ENV, RunTaskRequest
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, JOB_TAG

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


def rebuild_request(
    task: Mapping[str, Any], subnets: Sequence[str] = (), security_groups: Sequence[str] = ()
) -> RunTaskRequest:
    overrides = _overrides(task.get("overrides") or {})
    request: dict[str, Any] = {
        "cluster": task["clusterArn"],
        "taskDefinition": task["taskDefinitionArn"],
    }
    if overrides:
        request["overrides"] = overrides
    provider = task.get("capacityProviderName")
    if provider:
        request["capacityProviderStrategy"] = [{"capacityProvider": provider}]
    elif task.get("launchType"):
        request["launchType"] = task["launchType"]
    fargate = task.get("launchType") == "FARGATE" or str(provider).startswith("FARGATE")
    if task.get("platformVersion") and fargate:
        request["platformVersion"] = task["platformVersion"]
    if task.get("group"):
        request["group"] = task["group"]
    if task.get("enableExecuteCommand") is not None:
        request["enableExecuteCommand"] = bool(task["enableExecuteCommand"])
    tags = [
        {"key": t["key"], "value": t.get("value", "")}
        for t in task.get("tags") or []
        if "key" in t
        and not t["key"].startswith("aws:")
        and t["key"] not in (JOB_TAG, ATTEMPT_TAG, CHECKPOINT_CONTAINER_TAG)
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


def _network(
    task: Mapping[str, Any], subnets: Sequence[str], security_groups: Sequence[str]
) -> dict[str, Any]:
    """awsvpc tasks carry an ENI attachment that names their subnet; their security groups are not in
    the description, so the stack's defaults (if any) are used."""
    eni = next((a for a in task.get("attachments") or [] if a.get("type") == "ElasticNetworkInterface"), None)
    if eni is None:
        return {}
    details = {d.get("name"): d.get("value") for d in eni.get("details") or []}
    chosen = list(subnets) or ([details["subnetId"]] if details.get("subnetId") else [])
    if not chosen:
        return {}
    config: dict[str, Any] = {"subnets": chosen, "assignPublicIp": "DISABLED"}
    if security_groups:
        config["securityGroups"] = list(security_groups)
    return {"awsvpcConfiguration": config}


def checkpoint_uri_of(task: Mapping[str, Any], definition_env: Mapping[str, Mapping[str, str]]) -> str | None:
    """The task's own SPOTGUARD_CHECKPOINT_URI (an override, else its definition), if it set one."""
    for c in (task.get("overrides") or {}).get("containerOverrides") or []:
        for e in c.get("environment") or []:
            if e.get("name") == "SPOTGUARD_CHECKPOINT_URI" and _good_uri(e.get("value")):
                return str(e["value"])
    for env in definition_env.values():
        if _good_uri(env.get("SPOTGUARD_CHECKPOINT_URI")):
            return str(env["SPOTGUARD_CHECKPOINT_URI"])
    return None


def _good_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith("s3://") and value.endswith("/") and len(value) > 6

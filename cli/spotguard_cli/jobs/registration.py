"""Registering a job spec's task definition with ECS (or finding the one it names), and the submit
payload that runs it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from spotguard.domain.jobs.commands import CommandError
from spotguard_cli.jobs.spec import CONTAINER, JobSpec, first_line, spec_payload, task_definition

SPEC_LABEL = "spotguard.spec-sha256"  # on the container of a revision SpotGuard registered for a spec


def register(spec: JobSpec, ecs: Any, region: str) -> tuple[str, str]:
    """The task definition's ARN and its first container's name. A spec with an image: the family's
    newest revision when it was registered from the same request (a job submitted again makes no new
    revision), else a new one. A spec naming a task definition: that one, which must exist."""
    td = task_definition(spec, region)
    if td is None:
        try:
            named = ecs.describe_task_definition(taskDefinition=spec.task_definition)["taskDefinition"]
        except Exception as exc:  # ClientError: no such task definition
            said = f"task_definition: {spec.task_definition}: {first_line(exc)}"
            raise CommandError("BadRequest", said) from None
        return str(named["taskDefinitionArn"]), str(named["containerDefinitions"][0]["name"])
    # a revision is reused only when it was made from this very request (one registered by hand, or
    # from another spec, is not: it may hold what the spec does not say)
    digest = _spec_digest(td)
    td["containerDefinitions"][0]["dockerLabels"] = {SPEC_LABEL: digest}
    newest = _newest_revision(ecs, td["family"])
    if newest is None or _made_from(newest) != digest:
        newest = ecs.register_task_definition(**td)["taskDefinition"]
    return str(newest["taskDefinitionArn"]), CONTAINER


def _newest_revision(ecs: Any, name: str) -> dict[str, Any] | None:
    """The family's newest active revision, or None (a family not registered yet)."""
    arns = ecs.list_task_definitions(familyPrefix=name, status="ACTIVE", sort="DESC")["taskDefinitionArns"]
    # familyPrefix is the whole family on AWS; kept to exactly this one all the same
    ours = [a for a in arns if a.rsplit("/", 1)[-1].rsplit(":", 1)[0] == name]
    if not ours:
        return None
    newest = max(ours, key=lambda a: int(a.rsplit(":", 1)[-1]))
    return dict(ecs.describe_task_definition(taskDefinition=newest)["taskDefinition"])


def _spec_digest(td: dict[str, Any]) -> str:
    """What the registered revision was made from: the whole request, hashed (a label on its container)."""
    return hashlib.sha256(json.dumps(td, sort_keys=True).encode()).hexdigest()


def _made_from(revision: dict[str, Any]) -> str | None:
    containers = revision.get("containerDefinitions") or [{}]
    return (containers[0].get("dockerLabels") or {}).get(SPEC_LABEL)


def submit_spec(spec: JobSpec, aws: Any) -> dict[str, Any]:
    """Register (or find) the spec's task definition with `aws`'s ECS client; the submit payload."""
    ecs = aws("ecs")
    region = ecs.meta.region_name
    if not region:
        raise CommandError("BadRequest", "no AWS region: give --region (the task's logs are kept there)")
    arn, container = register(spec, ecs, region)
    return spec_payload(spec, arn, container)

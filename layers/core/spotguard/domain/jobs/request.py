"""The RunTask parameters of an attempt: the job's request, the SpotGuard environment in every container,
startedBy, tags, the client token, the EBS volume (EBS mode) and constraints away from interrupted hosts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

from spotguard.domain.jobs.effects import Launch
from spotguard.domain.jobs.model import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_URI,
    ENV_JOB_ID,
    ENV_NODE_RANK,
    ENV_NODES,
    ENV_RENDEZVOUS,
    ENV_RESUME_FROM,
    MAX_DEADLINE_HOURS,
    MAX_PLACEMENT_CONSTRAINTS,
    SPOTGUARD_ENV,
    AvoidedPool,
    Job,
    JobError,
    started_by,
)
from spotguard.domain.jobs.placement import placement_params
from spotguard.domain.jobs.replies import TaskDefinitionInfo
from spotguard.domain.jobs.submission import ATTEMPT_TAG, NODE_TAG, EbsOptions, JobOptions, RunTaskRequest
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, JOB_TAG


def run_task_params(
    job: Job,
    launch: Launch,
    resume_from: str,
    avoid_at: datetime,
    ebs_role: str | None = None,
    node: int = 0,
    rendezvous: str | None = None,
    beside: Sequence[str] = (),
    pool: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The RunTask parameters for an attempt: the job's request placed as its capacity decision says,
    the SpotGuard environment in every container, the attempt's startedBy, tags and client token, and
    constraints away from the interrupted instances and (for a while, unless it goes on-demand) their
    spot pools. A gang's node (`node`, from 0) also gets its rank, the node count and, for nodes after
    the first, node 0's address (`rendezvous`), keeps off the instances of the nodes placed already
    (`beside`): one node an instance, and goes where node 0 runs (`pool`: its instance type and zone)."""
    # where the job's capacity decision placed it (the request as submitted when there is none)
    params = placement_params(job.request.model_dump(mode="json", exclude_none=True), job.placement)
    env = {
        ENV_JOB_ID: job.job_id,
        ENV_ATTEMPT: str(launch.attempt),
        ENV_CHECKPOINT_URI: job.checkpoint_uri,
        ENV_RESUME_FROM: resume_from,
        **gang_env(job.options, node, rendezvous),
    }
    params["overrides"] = _with_env(params.get("overrides") or {}, job.containers, env)
    params["startedBy"] = started_by(job.job_id, launch.attempt, node)
    params["clientToken"] = launch.client_token
    params["tags"] = [
        *(params.get("tags") or []),
        {"key": JOB_TAG, "value": job.job_id},
        {"key": ATTEMPT_TAG, "value": str(launch.attempt)},
    ]
    if job.options.nodes > 1:
        params["tags"].append({"key": NODE_TAG, "value": str(node)})
    if job.options.checkpoint_container:  # where the interruption path sends SIGUSR1
        params["tags"].append({"key": CHECKPOINT_CONTAINER_TAG, "value": job.options.checkpoint_container})
    if job.ebs_volume:
        params["volumeConfigurations"] = [ebs_volume_configuration(job, launch.attempt, ebs_role)]
    if not job.request.fargate:  # Fargate takes no placement constraints
        constraints = list(params.get("placementConstraints") or [])
        if pool is not None:  # a gang runs in one pool: training across zones is slow and billed
            same = (
                f"attribute:ecs.instance-type == {pool[0]} and attribute:ecs.availability-zone == {pool[1]}"
            )
            constraints.append({"type": "memberOf", "expression": same})
        room = MAX_PLACEMENT_CONSTRAINTS - len(constraints)
        # an avoided pool is spot capacity of a type in a zone: on-demand there is not what was reclaimed
        on_demand = job.placement is not None and job.placement.placement == "on-demand"
        pools = [] if on_demand else job.avoid_pools
        avoided = [*job.avoid_instances, *(i for i in beside if i not in job.avoid_instances)]
        constraints += avoid_constraints(avoided, pools, avoid_at)[: max(0, room)]
        if constraints:
            params["placementConstraints"] = constraints
    return params


def gang_env(options: JobOptions, node: int, rendezvous: str | None) -> dict[str, str]:
    """A gang's environment for its node `node`: SpotGuard's names and torchrun's (PET_NNODES,
    PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_CONF: torchrun reads PET_<ARGUMENT> for an
    argument not given). Node 0 hosts the rendezvous: it keeps torchrun's default address (itself). Its
    rendezvous waits longer than SpotGuard gives the gang to form (torchrun's own 600 s would end node 0
    with exit 1, a failure, while its peers still boot): SpotGuard gives an unformed gang up first.
    Nothing for a one-node job."""
    nodes, port = options.nodes, options.rendezvous_port
    if nodes <= 1:
        return {}
    env = {
        ENV_NODE_RANK: str(node),
        ENV_NODES: str(nodes),
        "PET_NNODES": str(nodes),
        "PET_NODE_RANK": str(node),
        "PET_MASTER_PORT": str(port),
        "PET_RDZV_CONF": f"timeout={options.provisioning_timeout_seconds + RENDEZVOUS_MARGIN_SECONDS}",
    }
    if node > 0 and rendezvous:
        env |= {"PET_MASTER_ADDR": rendezvous, ENV_RENDEZVOUS: f"{rendezvous}:{port}"}
    return env


# A gang's node's own constraints: the capacity decision's pin, node 0's pool, off the other nodes' instances
GANG_CONSTRAINTS = 3
# past the formation bound: reconcile looks every 5 minutes, and the other nodes are launched once node 0 runs
RENDEZVOUS_MARGIN_SECONDS = 900


def ebs_volume_configuration(job: Job, attempt: int, default_role: str | None) -> dict[str, Any]:
    """The managed EBS volume of an attempt: from the newest completed snapshot, kept when the task
    stops (SpotGuard snapshots it, then deletes it), tagged with the job and the attempt."""
    o = job.options.ebs or EbsOptions()
    role = o.role_arn or default_role
    if not role:
        raise JobError("EBS mode needs a role for ECS to manage the volume (options.ebs.role_arn)")
    volume: dict[str, Any] = {
        "sizeInGiB": o.size_gib,
        "volumeType": o.volume_type,
        "filesystemType": o.filesystem,
        "roleArn": role,
        "encrypted": True,
        "terminationPolicy": {"deleteOnTermination": False},
        "tagSpecifications": [
            {
                "resourceType": "volume",
                "tags": [
                    {"key": JOB_TAG, "value": job.job_id},
                    {"key": ATTEMPT_TAG, "value": str(attempt)},
                ],
                "propagateTags": "NONE",
            }
        ],
    }
    for key, value in (("iops", o.iops), ("throughput", o.throughput), ("kmsKeyId", o.kms_key_id)):
        if value is not None:
            volume[key] = value
    if job.snapshots:
        volume["snapshotId"] = job.snapshots[-1]
    return {"name": job.ebs_volume, "managedEBSVolume": volume}


def avoid_constraints(
    instances: Sequence[str], pools: Sequence[AvoidedPool], now: datetime
) -> list[dict[str, str]]:
    """memberOf constraints in the cluster query language: off these instances, and off each spot pool
    (instance type in an availability zone) while it is avoided."""
    out: list[dict[str, str]] = []
    if instances:
        out.append({"type": "memberOf", "expression": f"ec2InstanceId !in [{', '.join(instances)}]"})
    for p in sorted(pools, key=lambda p: p.until, reverse=True):
        if p.until > now:
            out.append(
                {
                    "type": "memberOf",
                    "expression": f"attribute:ecs.instance-type != {p.instance_type} or "
                    f"attribute:ecs.availability-zone != {p.availability_zone}",
                }
            )
    return out


def _with_env(
    overrides: Mapping[str, Any], containers: Sequence[str], env: Mapping[str, str]
) -> dict[str, Any]:
    """Container overrides with the SpotGuard environment set (replacing any earlier SPOTGUARD_ values)
    in every container of the task definition and every container the request overrides."""
    out = dict(overrides)
    by_name: dict[str, dict[str, Any]] = {}
    for c in overrides.get("containerOverrides") or []:
        by_name[str(c.get("name", ""))] = dict(c)
    for name in containers:
        by_name.setdefault(name, {"name": name})
    result = []
    for name, c in by_name.items():
        kept = [e for e in c.get("environment") or [] if e.get("name") not in (*SPOTGUARD_ENV, *env)]
        c["environment"] = [*kept, *({"name": k, "value": v} for k, v in env.items())]
        c["name"] = name
        result.append(c)
    out["containerOverrides"] = result
    return out


def not_permitted(
    request: RunTaskRequest,
    options: JobOptions,
    td: TaskDefinitionInfo,
    pass_roles: Sequence[str],
    families: Sequence[str],
    stack_volume_role: str | None = None,
) -> str | None:
    """Why the stack may not run this request (None: it may): a role it would pass to ECS that is not
    one of `pass_roles` (ARN patterns, `*` a wildcard: the stack's TaskRoleArns), or a task definition
    family not in `families` (TaskDefinitionFamilies). Empty lists restrict nothing here (IAM still
    does). Checked at submit, so that a user hears it in one line instead of RunTask's AccessDenied.
    A volume the request configures itself may not use the stack's own EBS role (`stack_volume_role`):
    that role is SpotGuard's, for EBS mode, and with it a request could have any snapshot restored."""
    for i, volume in enumerate(request.volumeConfigurations or []):
        role = ((volume or {}).get("managedEBSVolume") or {}).get("roleArn")
        if role and stack_volume_role and role == stack_volume_role:
            return (
                f"request.volumeConfigurations.{i}.managedEBSVolume.roleArn: the stack's own EBS role is "
                "SpotGuard's (EBS mode); name a role of yours"
            )
    if families and td.family and td.family not in families:
        return (
            f"request.taskDefinition: family {td.family!r} is not one this stack runs "
            f"(TaskDefinitionFamilies: {', '.join(families)})"
        )
    if not pass_roles:
        return None
    overrides = request.overrides or {}
    roles = [
        ("request.overrides.taskRoleArn", overrides.get("taskRoleArn")),
        ("request.overrides.executionRoleArn", overrides.get("executionRoleArn")),
        ("the task definition's taskRoleArn", td.task_role_arn),
        ("the task definition's executionRoleArn", td.execution_role_arn),
        ("options.ebs.role_arn", options.ebs.role_arn if options.ebs else None),
        *(
            (
                f"request.volumeConfigurations.{i}.managedEBSVolume.roleArn",
                ((v or {}).get("managedEBSVolume") or {}).get("roleArn"),
            )
            for i, v in enumerate(request.volumeConfigurations or [])
        ),
    ]
    for where, role in roles:
        if role and not any(fnmatchcase(str(role), pattern) for pattern in pass_roles):
            allowed = ", ".join(pass_roles)
            return f"{where}: {role} is not a role this stack may pass (TaskRoleArns: {allowed})"
    return None


def deadline_refused(deadline: datetime | None, now: datetime) -> str | None:
    """Why a deadline given at submit is refused (None: it is not, or there is none): it must be after
    `now` (the jobs function's clock) and at most `MAX_DEADLINE_HOURS` after it, in one line naming the
    field and the bound. Only at submit: a stored job whose deadline has passed is still read, and
    decided as one that cannot meet it."""
    if deadline is None:
        return None
    latest = now + timedelta(hours=MAX_DEADLINE_HOURS)
    if now < deadline <= latest:
        return None
    return (
        f"options.deadline: must be after now and at most {MAX_DEADLINE_HOURS:,} h (a year) from now, "
        f"between {_iso(now)} and {_iso(latest)}; got {_iso(deadline)}"
    )


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds").replace("+00:00", "Z")

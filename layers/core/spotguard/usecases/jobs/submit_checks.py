"""The submit's own checks, beyond the request's (domain.jobs.request): why a multi-node job cannot run
as submitted, what a job id already taken answers, and which AWS errors refuse the request itself."""

from __future__ import annotations

from spotguard.domain.jobs.commands import CommandError, Submit
from spotguard.domain.jobs.model import MAX_PLACEMENT_CONSTRAINTS, Job
from spotguard.domain.jobs.replies import TaskDefinitionInfo
from spotguard.domain.jobs.request import GANG_CONSTRAINTS
from spotguard.domain.jobs.run_errors import classify_run_error


def gang_refusal(cmd: Submit, td: TaskDefinitionInfo, ebs: bool) -> str | None:
    """Why a multi-node job cannot run as submitted (None: it can, or it is one node): its nodes are
    instances (no Fargate) that reach each other at their addresses (host or awsvpc networking: bridge
    publishes neither the rendezvous port nor NCCL's), each with its own disk (no EBS mode: one volume a
    job), and each node's RunTask needs room for SpotGuard's own placement constraints."""
    if cmd.options.nodes <= 1:
        return None
    if cmd.request.fargate:
        return "options.nodes: a multi-node job runs one node an EC2 instance; Fargate has none"
    mode = td.network_mode or "bridge"
    if mode not in ("host", "awsvpc"):
        return (
            f"options.nodes: the nodes of a multi-node job reach each other at their addresses, and "
            f"{td.arn} has networkMode {mode}: use host (or awsvpc with a security group that lets them "
            "talk)"
        )
    most = MAX_PLACEMENT_CONSTRAINTS - GANG_CONSTRAINTS
    if len(cmd.request.placementConstraints or []) > most:
        return (
            f"request.placementConstraints: a multi-node job may give at most {most} (ECS takes "
            f"{MAX_PLACEMENT_CONSTRAINTS}; SpotGuard keeps each node in one pool and off the others' "
            "instances)"
        )
    if ebs:
        return (
            "options.nodes: a multi-node job checkpoints to S3; EBS mode gives a job one volume "
            "(set options.checkpoint_mode to s3)"
        )
    return None


def same_submit(job: Job, cmd: Submit) -> Job:
    if job.request == cmd.request and job.options == cmd.options:
        return job  # a repeated submit: the job it made the first time
    again = f"; `spotguard jobs resubmit {job.job_id}` runs it again as it was" if job.state.terminal else ""
    raise CommandError(
        "Conflict",
        f"job {job.job_id} exists already ({job.state}) with another request or options: "
        f"give the job another name{again}",
    )


def aws_refused(exc: Exception) -> bool:
    """Whether an AWS error refuses the request itself (a name unknown, a parameter wrong, not allowed),
    as opposed to a throttle, a server error or a timeout, which say nothing of the request."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False  # no answer at all (a timeout, a connection lost)
    err = response.get("Error", {})
    return classify_run_error(str(err.get("Code", "")), str(err.get("Message", ""))) in ("request", "access")


def aws_message(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', 'Error')}: {err.get('Message', '')}".strip()
    return str(exc)

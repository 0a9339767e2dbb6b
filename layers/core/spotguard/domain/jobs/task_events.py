"""What one record on the task-events queues is. Pure.

Records arrive as ECS Task State Change events (from EventBridge), SpotGuard's own "Launch Due"
messages (a job waiting for capacity, from the retry queue), EBS Snapshot Notifications and Auto Scaling's
"EC2 Instance Launch Unsuccessful" / "EC2 Instance Launch Successful" (facts about a pool's capacity),
and the spot warnings and terminate actions the interruption function acts on (for the early
replacement of the jobs on the warned host: domain.jobs.spares).
Each becomes exactly one decision: act on a task event, launch a job, settle a snapshot, record a pool
fact, ignore with a reason, or reject (dead-letter queue).

A pool event's time is bounded at the door: one with no UTC time (the end of the calendar) is rejected,
and, given the clock (`now`), so is one dated further ahead of it than clock skew
(`domain.pools.ahead_of_clock`): a bad record, said in one line, never retried. One dated in the past,
however far, is taken as old history (the pool weighs it by its time).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from spotguard.domain.envelope import MAX_VERSION, EventTime, Refused, envelope
from spotguard.domain.errors import one_line
from spotguard.domain.interruption.classify import WARNINGS, classify_event
from spotguard.domain.interruption.notices import Notice
from spotguard.domain.own_events import LAUNCH_DUE, SOURCE
from spotguard.domain.pools import ahead_of_clock
from spotguard.domain.settings import Settings
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, JOB_ID, MANAGED_TAG, TaskEvent, TaskInfo

TASK_STATE_CHANGE = "ECS Task State Change"
EBS_SNAPSHOT = "EBS Snapshot Notification"
LAUNCH_UNSUCCESSFUL = "EC2 Instance Launch Unsuccessful"  # aws.autoscaling: a pool had no capacity
LAUNCH_SUCCESSFUL = "EC2 Instance Launch Successful"  # aws.autoscaling: a pool had capacity (an instance)
_SNAPSHOT_ID = re.compile(r"(snap-[0-9a-f]{8,17})$")


class ContainerDetail(BaseModel):
    """A container of a task: what SpotGuard reads is typed (an exitCode that is not an integer is bad
    input, rejected at the door rather than copied into a job); the rest is kept as it came."""

    model_config = ConfigDict(extra="allow")
    name: str = ""
    exitCode: StrictInt | None = None
    reason: str | None = None
    runtimeId: str | None = None
    lastStatus: str | None = None


class TaskDetail(BaseModel):
    """The fields of an ECS Task State Change detail that SpotGuard reads (others are ignored)."""

    model_config = ConfigDict(extra="ignore")
    # ARNs and ids key ledger items, whose keys have a bounded length: real ones are far shorter
    taskArn: str = Field(pattern=r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/", max_length=1000)
    clusterArn: str = Field(pattern=r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:cluster/", max_length=1000)
    lastStatus: str = Field(min_length=1)
    desiredStatus: str = ""
    version: int = Field(ge=0, le=MAX_VERSION)
    startedBy: str = ""
    taskDefinitionArn: str = ""
    containerInstanceArn: str | None = Field(default=None, max_length=1000)
    availabilityZone: str | None = None
    capacityProviderName: str | None = None
    launchType: str | None = None
    group: str | None = None
    startedAt: EventTime | None = None
    stoppingAt: EventTime | None = None
    stoppedAt: EventTime | None = None
    stopCode: str | None = None
    stoppedReason: str | None = None
    containers: list[ContainerDetail] = Field(default_factory=list)
    overrides: dict[str, Any] | None = None
    enableExecuteCommand: bool | None = None
    createdAt: EventTime | None = None
    platformVersion: str | None = None
    attachments: list[dict[str, Any]] = Field(default_factory=list)
    tags: list[dict[str, Any]] = Field(default_factory=list)  # DescribeTasks with TAGS; not in events


class LaunchDueDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Field(alias="job-id", pattern=JOB_ID.pattern)
    launch_try: int = Field(alias="launch-try", ge=0)


class SnapshotDetail(BaseModel):
    model_config = ConfigDict(extra="ignore")
    event: str
    result: str
    snapshot_id: str = Field(min_length=1)
    cause: str = ""


class LaunchUnsuccessfulDetail(BaseModel):
    """Auto Scaling could not launch an instance: for a spot group, usually no spot capacity of its
    types in that zone now (`StatusMessage` says)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    group: str = Field(alias="AutoScalingGroupName", min_length=1, max_length=255)
    status_message: str = Field(default="", alias="StatusMessage", max_length=4000)
    cause: str = Field(default="", alias="Cause", max_length=4000)
    details: dict[str, str] = Field(default_factory=dict, alias="Details")

    @property
    def zone(self) -> str | None:
        return self.details.get("Availability Zone") or None


class LaunchSuccessfulDetail(LaunchUnsuccessfulDetail):
    """Auto Scaling launched an instance (`EC2InstanceId`) for the group in that zone: the same fields."""

    instance_id: str | None = Field(default=None, alias="EC2InstanceId", max_length=100)


class PoolEvent(BaseModel):
    """A fact about a pool's capacity that arrived as an event: Auto Scaling could not launch an
    instance in the group's zone (`available` False), or it launched one there (True: capacity was
    there at `at`, the evidence a move to the pool waits for)."""

    model_config = ConfigDict(frozen=True)
    group: str
    zone: str | None
    message: str
    at: datetime
    available: bool = False


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True)
    reason: str
    event_id: str | None = None


class RejectMessage(_Message):
    """Bad input no retry can fix: to the dead-letter queue with its reason."""

    outcome: Literal["reject"] = "reject"


class IgnoreMessage(_Message):
    """Not the task-events function's to act on: logged, nothing else."""

    outcome: Literal["ignore"] = "ignore"


class TaskStateMessage(_Message):
    """An ECS task's state changed: the job state machine's event."""

    outcome: Literal["act"] = "act"
    task: TaskEvent


class LaunchDueMessage(_Message):
    """SpotGuard's own retry: a job waiting for capacity is due to be launched again."""

    outcome: Literal["launch"] = "launch"
    job_id: str
    launch_try: int


class SnapshotMessage(_Message):
    """EBS mode: an attempt's snapshot finished (`snapshot_ok`) or failed."""

    outcome: Literal["snapshot"] = "snapshot"
    snapshot_id: str
    snapshot_ok: bool


class PoolEventMessage(_Message):
    """Auto Scaling launched an instance, or failed to: a fact of the group's pool."""

    outcome: Literal["pool"] = "pool"
    pool_event: PoolEvent


class WarningMessage(_Message):
    """A spot warning or a terminate action: the instance going (the early replacement)."""

    outcome: Literal["warning"] = "warning"
    notice: Notice


# One record's classification, a message of one kind each: the handler acts by its type, and each carries
# exactly the fields its action needs. `outcome` names the kind for the router (reject, ignore, or act).
TaskMessage = Annotated[
    RejectMessage
    | IgnoreMessage
    | TaskStateMessage
    | LaunchDueMessage
    | SnapshotMessage
    | PoolEventMessage
    | WarningMessage,
    Field(discriminator="outcome"),
]


def classify_task_message(
    raw: str | bytes | dict[str, Any], settings: Settings, now: datetime | None = None
) -> TaskMessage:
    """One record's decision. `now`: the clock, against which a pool event's time is bounded (without
    it, only a time with no UTC value is refused; the use case bounds the rest, `pool_event_refused`)."""
    event = envelope(raw)
    if isinstance(event, Refused):
        return RejectMessage(reason=event.reason, event_id=event.event_id)
    if event.source == SOURCE and event.detail_type == LAUNCH_DUE:
        return _launch_due(event)
    if event.source == "aws.ec2" and event.detail_type == EBS_SNAPSHOT:
        return _snapshot(event)
    if event.source == "aws.autoscaling" and event.detail_type == LAUNCH_UNSUCCESSFUL:
        return _timed(_launch_unsuccessful(event), now)
    if event.source == "aws.autoscaling" and event.detail_type == LAUNCH_SUCCESSFUL:
        return _timed(_launch_successful(event), now)
    if (event.source, event.detail_type) in WARNINGS:
        return _warning(event, settings)
    if event.source != "aws.ecs" or event.detail_type != TASK_STATE_CHANGE:
        return IgnoreMessage(
            reason=f"the task-events function does not act on {event.source} '{event.detail_type}'",
            event_id=event.id,
        )
    try:
        d = TaskDetail.model_validate(event.detail)
    except ValidationError as exc:
        return RejectMessage(reason=f"detail.{one_line(exc)}", event_id=event.id)
    if not settings.watches(d.clusterArn):
        return IgnoreMessage(reason=f"cluster {d.clusterArn} is not watched", event_id=event.id)
    task = _task_event(d, event.id, event.time)
    return TaskStateMessage(reason=f"task {d.lastStatus}", event_id=event.id, task=task)


def _warning(event: EventBridgeModel, settings: Settings) -> TaskMessage:
    """A spot warning or a terminate action, read as the interruption function reads it: for the early
    replacement of the jobs on its host."""
    decision = classify_event(event, settings)
    if decision.outcome == "reject":
        return RejectMessage(reason=decision.reason, event_id=event.id)
    if decision.outcome != "act" or not decision.notices:
        return IgnoreMessage(reason=decision.reason, event_id=event.id)
    return WarningMessage(reason=decision.reason, event_id=event.id, notice=decision.notices[0])


def described_task(task: Mapping[str, Any]) -> TaskEvent:
    """A DescribeTasks entry as the domain reads it (the same field names as an event's detail; a
    description may lack `version`). Raises ValidationError on a task that is not one."""
    return _task_event(TaskDetail.model_validate({**task, "version": task.get("version") or 0}), "", None)


def _task_event(d: TaskDetail, event_id: str, time: datetime | None) -> TaskEvent:
    return TaskEvent(
        event_id=event_id,
        task_arn=d.taskArn,
        cluster_arn=d.clusterArn,
        version=d.version,
        last_status=d.lastStatus,
        desired_status=d.desiredStatus,
        started_by=d.startedBy,
        task_definition_arn=d.taskDefinitionArn,
        container_instance_arn=d.containerInstanceArn,
        availability_zone=d.availabilityZone,
        capacity_provider=d.capacityProviderName,
        launch_type=d.launchType,
        group=d.group,
        started_at=d.startedAt,
        stopping_at=d.stoppingAt,
        stopped_at=d.stoppedAt,
        stop_code=d.stopCode,
        stopped_reason=d.stoppedReason,
        containers=tuple(c.model_dump(exclude_unset=True) for c in d.containers),
        overrides=d.overrides,
        enable_execute_command=d.enableExecuteCommand,
        time=time,
        created_at=d.createdAt,
        platform_version=d.platformVersion,
        subnet_id=_eni_detail(d.attachments, "subnetId"),
        private_ip=_eni_detail(d.attachments, "privateIPv4Address"),
        tags={str(tag["key"]): str(tag.get("value", "")) for tag in d.tags if "key" in tag},
    )


def _eni_detail(attachments: list[dict[str, Any]], name: str) -> str | None:
    """awsvpc tasks carry an ENI attachment that names their subnet and their private address."""
    eni = next((a for a in attachments if a.get("type") == "ElasticNetworkInterface"), None)
    details = {d.get("name"): d.get("value") for d in (eni or {}).get("details") or [] if isinstance(d, dict)}
    value = details.get(name)
    return str(value) if value else None


def _launch_due(event: EventBridgeModel) -> TaskMessage:
    try:
        d = LaunchDueDetail.model_validate(event.detail)
    except ValidationError as exc:
        return RejectMessage(reason=f"detail.{one_line(exc)}", event_id=event.id)
    return LaunchDueMessage(
        reason="a job waiting for capacity is due",
        event_id=event.id,
        job_id=d.job_id,
        launch_try=d.launch_try,
    )


def _snapshot(event: EventBridgeModel) -> TaskMessage:
    """EBS Snapshot Notification: `snapshot_id` is an ARN (arn:aws:ec2::REGION:snapshot/snap-...)."""
    try:
        d = SnapshotDetail.model_validate(event.detail)
    except ValidationError as exc:
        return RejectMessage(reason=f"detail.{one_line(exc)}", event_id=event.id)
    if d.event not in ("createSnapshot", "createSnapshots"):
        return IgnoreMessage(reason=f"EBS {d.event} events are not SpotGuard's", event_id=event.id)
    m = _SNAPSHOT_ID.search(d.snapshot_id)
    if not m:
        return RejectMessage(reason="detail.snapshot_id: names no snapshot", event_id=event.id)
    ok = d.result == "succeeded"
    return SnapshotMessage(
        reason=f"snapshot {m.group(1)} {d.result}" + (f": {d.cause}" if d.cause else ""),
        event_id=event.id,
        snapshot_id=m.group(1),
        snapshot_ok=ok,
    )


def indexed_info(task: TaskEvent, managed: bool, gpu: bool, checkpoint_container: str | None) -> TaskInfo:
    """What the host's task index keeps of a task: enough for the interruption path to pick the managed
    ones and signal the right container without describing them."""
    tags = {MANAGED_TAG: "true"} if managed else {}
    if managed and checkpoint_container:
        tags[CHECKPOINT_CONTAINER_TAG] = checkpoint_container
    return task.info(gpu=gpu, tags=tags)


def pool_event_refused(ev: PoolEvent, now: datetime) -> str | None:
    """Why a pool event cannot be kept as a fact at `now`, in one line (None: it can): its time is
    further ahead of the clock than clock skew, or has no UTC value."""
    problem = ahead_of_clock(ev.at, now)
    return f"Auto Scaling group {ev.group}: {problem}" if problem else None


def _timed(msg: TaskMessage, now: datetime | None) -> TaskMessage:
    """A pool event's message, rejected when its time cannot be a fact (see `pool_event_refused`); its
    time in UTC otherwise."""
    if not isinstance(msg, PoolEventMessage):
        return msg
    ev = msg.pool_event
    try:
        at = ev.at.astimezone(UTC)
    except OverflowError:
        problem: str | None = f"Auto Scaling group {ev.group}: time {ev.at.isoformat()}: out of range"
    else:
        problem = pool_event_refused(ev, now) if now is not None else None
    if problem:
        return RejectMessage(reason=problem, event_id=msg.event_id)
    return msg.model_copy(update={"pool_event": ev.model_copy(update={"at": at})})


def _launch_unsuccessful(event: EventBridgeModel) -> TaskMessage:
    try:
        d = LaunchUnsuccessfulDetail.model_validate(event.detail)
    except ValidationError as exc:
        return RejectMessage(reason=f"detail.{one_line(exc)}", event_id=event.id)
    message = (d.status_message or d.cause or "no reason given")[:500]
    pool = PoolEvent(group=d.group, zone=d.zone, message=message, at=event.time)
    return PoolEventMessage(
        reason=f"Auto Scaling group {d.group}: launch failed",
        event_id=event.id,
        pool_event=pool,
    )


def _launch_successful(event: EventBridgeModel) -> TaskMessage:
    """Auto Scaling launched an instance for a group (StatusCode "InProgress" while lifecycle hooks
    run, else "Successful"): the group had capacity in that zone at the event's time."""
    try:
        d = LaunchSuccessfulDetail.model_validate(event.detail)
    except ValidationError as exc:
        return RejectMessage(reason=f"detail.{one_line(exc)}", event_id=event.id)
    message = f"launched {d.instance_id}" if d.instance_id else "launched an instance"
    pool = PoolEvent(group=d.group, zone=d.zone, message=message, at=event.time, available=True)
    return PoolEventMessage(
        reason=f"Auto Scaling group {d.group}: instance launched",
        event_id=event.id,
        pool_event=pool,
    )

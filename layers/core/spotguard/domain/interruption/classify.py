"""One raw EventBridge event classified into exactly one decision: act on typed notices, ignore with a
reason, or reject.

Pure: no boto3, no clock. Every event the interruption queue can carry comes through `classify`, and so do
the events `spotguard explain` is given, so what the CLI prints is what the Lambda does. One small parser
per event kind, their detail models, and the one table that routes each kind to its parser (`WARNINGS`
and the table below), so that one file shows every event the interruption function takes; what it then
does with each is `notices.actions`.

Quirks of the platform handled here (the envelope and the guards every classifier shares are in
`envelope.py`; what a stack's settings change, in `settings.py`):
- ids come from `detail`, never from `resources` (the spot warning's ARN may hold an availability zone
  where the region should be, and no account);
- AWS Health times are RFC 1123 with sometimes wrong weekdays; Health numbers and booleans arrive as
  strings.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from spotguard.domain.envelope import MAX_VERSION, EventTime, InstanceId, Refused, envelope, instance_id_of
from spotguard.domain.errors import one_line
from spotguard.domain.interruption.notices import (
    SPOT_WARNING_SECONDS,
    ContainerInstanceUpdate,
    Decision,
    LifecycleRef,
    Notice,
    NoticeKind,
)
from spotguard.domain.own_events import LIFECYCLE_CHECK, SOURCE
from spotguard.domain.settings import RebalanceMode, Settings

# ---------------------------------------------------------------------------------------------- details


def _health_time(value: Any) -> datetime:
    """AWS Health: 'Wed, 08 Feb 2023 12:00:00 GMT' (the weekday may be wrong), or ISO 8601."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a time string")
    text = value.strip()
    if "," in text[:5]:
        text = text.split(",", 1)[1].strip()  # drop the weekday: Health sometimes gets it wrong
        try:
            return parsedate_to_datetime(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{value!r} is not an RFC 1123 time") from exc
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a time") from exc


HealthTime = Annotated[datetime, BeforeValidator(_health_time)]


class _EventDetail(BaseModel):
    """The detail of one kind of event. Built at its first use: a cold start builds only the kinds it
    sees, not all eight."""

    model_config = ConfigDict(defer_build=True)


class SpotWarningDetail(_EventDetail):
    instance_id: InstanceId = Field(alias="instance-id")
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class RebalanceDetail(_EventDetail):
    instance_id: InstanceId = Field(alias="instance-id")


class StateChangeDetail(_EventDetail):
    instance_id: InstanceId = Field(alias="instance-id")
    state: str


class LifecycleDetail(_EventDetail):
    token: str = Field(alias="LifecycleActionToken", min_length=36, max_length=36)
    group: str = Field(alias="AutoScalingGroupName", min_length=1)
    hook: str = Field(alias="LifecycleHookName", min_length=1)
    instance_id: InstanceId = Field(alias="EC2InstanceId")
    transition: str = Field(alias="LifecycleTransition")


class HealthEntity(_EventDetail):
    entity_value: str = Field(alias="entityValue")


class HealthDetail(_EventDetail):
    service: str
    event_type_code: str = Field(alias="eventTypeCode")
    event_type_category: str = Field(alias="eventTypeCategory")
    status_code: str = Field(default="open", alias="statusCode")
    start_time: HealthTime | None = Field(default=None, alias="startTime")
    affected_entities: list[HealthEntity] = Field(default_factory=list, alias="affectedEntities")

    @field_validator("affected_entities", mode="before")
    @classmethod
    def _entities(cls, v: Any) -> Any:
        return [] if v is None else v


class ContainerInstanceDetail(_EventDetail):
    cluster_arn: str = Field(alias="clusterArn", pattern=r"^arn:aws[\w-]*:ecs:", max_length=1000)
    container_instance_arn: str = Field(
        alias="containerInstanceArn", pattern=r"^arn:aws[\w-]*:ecs:", max_length=1000
    )
    instance_id: InstanceId = Field(alias="ec2InstanceId")
    status: str = Field(max_length=64)
    version: int = Field(ge=0, le=MAX_VERSION)


class LifecycleCheckDetail(_EventDetail):
    """SpotGuard's own follow-up, sent to the interruption queue with a delay while tasks still stop."""

    instance_id: InstanceId = Field(alias="instance-id")
    lifecycle: LifecycleRef
    deadline: EventTime
    notice_key: str = Field(alias="notice-key", max_length=512)


# --------------------------------------------------------------------------------------------- classify

ACTED_STATES = {"stopping", "stopped", "shutting-down", "terminated"}
HEALTH_CATEGORIES = {"scheduledChange", "issue"}
TASK_EVENT_TYPES = {"ECS Task State Change"}


def reject(reason: str, event_id: str | None = None, kind: str | None = None) -> Decision:
    return Decision(outcome="reject", reason=reason, event_id=event_id, kind=kind)


def classify(raw: str | bytes | dict[str, Any], settings: Settings) -> Decision:
    """Classify one event (an SQS body, a file's text, or an already decoded dict)."""
    event = envelope(raw)
    if isinstance(event, Refused):
        return reject(event.reason, event.event_id)
    return classify_event(event, settings)


def classify_event(event: EventBridgeModel, settings: Settings) -> Decision:
    """Classify one event already read from its envelope (the task-events function reads the warnings
    it also gets, for the early replacement, with this same reading)."""
    try:
        return _classify_event(event, settings)
    except OverflowError:  # a time so close to the end of the calendar that its deadline overflows
        return reject("time: out of range", event.id)


# The events that say an instance is going, which the task-events function gets too (the early
# replacement: domain.jobs.spares): a spot warning and an Auto Scaling terminate action; and, with
# SpareOnRebalance, the rebalance recommendation that often comes minutes before the warning.
WARNINGS = frozenset(
    {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
        ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"),
        ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    }
)


def _classify_event(event: EventBridgeModel, settings: Settings) -> Decision:
    known = _EVENT_TYPES.get((event.source, event.detail_type))
    if known is None:
        if event.detail_type in TASK_EVENT_TYPES:
            return _task_event(event)
        return Decision(
            outcome="ignore",
            reason=f"SpotGuard does not act on {event.source} '{event.detail_type}' events",
            event_id=event.id,
        )
    kind, parse = known
    try:
        return parse(event, settings)
    except ValidationError as exc:
        return reject(f"detail.{one_line(exc)}", event.id, kind)


def _notice(event: EventBridgeModel, kind: NoticeKind, instance_id: str, **kw: Any) -> Notice:
    return Notice(kind=kind, instance_id=instance_id, event_id=event.id, event_time=event.time, **kw)


def _act(event: EventBridgeModel, kind: NoticeKind, reason: str, *notices: Notice) -> Decision:
    return Decision(outcome="act", reason=reason, kind=kind, event_id=event.id, notices=notices)


def _ignore(event: EventBridgeModel, kind: NoticeKind, reason: str) -> Decision:
    return Decision(outcome="ignore", reason=reason, kind=kind, event_id=event.id)


def _spot_warning(event: EventBridgeModel, settings: Settings) -> Decision:
    d = SpotWarningDetail.model_validate(event.detail)
    # Hibernation starts at once: there is no two-minute warning to spend.
    grace = 0 if d.instance_action == "hibernate" else SPOT_WARNING_SECONDS
    notice = _notice(
        event,
        NoticeKind.SPOT_INTERRUPTION,
        d.instance_id,
        deadline=event.time + timedelta(seconds=grace),
        detail=f"instance-action={d.instance_action}",
    )
    return _act(event, NoticeKind.SPOT_INTERRUPTION, f"spot instance will {d.instance_action}", notice)


def _rebalance(event: EventBridgeModel, settings: Settings) -> Decision:
    d = RebalanceDetail.model_validate(event.detail)
    kind = NoticeKind.REBALANCE
    if settings.rebalance is RebalanceMode.IGNORE:
        return _ignore(event, kind, "rebalance recommendations are ignored (RebalanceAction=ignore)")
    notice = _notice(event, kind, d.instance_id, deadline=None, detail=f"mode={settings.rebalance}")
    return _act(event, kind, f"elevated interruption risk (RebalanceAction={settings.rebalance})", notice)


def _state_change(event: EventBridgeModel, settings: Settings) -> Decision:
    d = StateChangeDetail.model_validate(event.detail)
    kind = NoticeKind.INSTANCE_STATE
    if d.state not in ACTED_STATES:
        return _ignore(event, kind, f"instance state '{d.state}' is not a stop or termination")
    notice = _notice(event, kind, d.instance_id, deadline=event.time, detail=f"state={d.state}")
    return _act(event, kind, f"instance is {d.state}", notice)


def _lifecycle(event: EventBridgeModel, settings: Settings) -> Decision:
    d = LifecycleDetail.model_validate(event.detail)
    kind = NoticeKind.LIFECYCLE_TERMINATE
    if d.transition != "autoscaling:EC2_INSTANCE_TERMINATING":
        return _ignore(event, kind, f"lifecycle transition '{d.transition}' is not a termination")
    if not d.hook.startswith(settings.lifecycle_hook_prefix):
        return _ignore(
            event,
            kind,
            f"lifecycle hook '{d.hook}' is not SpotGuard's (its names start with "
            f"'{settings.lifecycle_hook_prefix}'): left to its owner",
        )
    ref = LifecycleRef(group=d.group, hook=d.hook, token=d.token)
    notice = _notice(event, kind, d.instance_id, deadline=None, lifecycle=ref, detail=f"group={d.group}")
    return _act(event, kind, f"Auto Scaling is terminating the instance (hook {d.hook})", notice)


def _health(event: EventBridgeModel, settings: Settings) -> Decision:
    d = HealthDetail.model_validate(event.detail)
    kind = NoticeKind.HEALTH
    if d.service != "EC2":
        return _ignore(event, kind, f"AWS Health event for {d.service}, not EC2")
    if d.event_type_category not in HEALTH_CATEGORIES:
        return _ignore(
            event, kind, f"AWS Health category '{d.event_type_category}' does not affect instances"
        )
    if d.status_code.lower() == "closed":
        return _ignore(event, kind, f"AWS Health event {d.event_type_code} is closed")
    # AWS names an affected instance by its id or by its ARN (AWS's own retirement example does so)
    ids = sorted({i for e in d.affected_entities if (i := instance_id_of(e.entity_value))})
    if not ids:
        return _ignore(event, kind, f"AWS Health event {d.event_type_code} names no EC2 instance")
    deadline = d.start_time if d.start_time is not None else event.time
    notices = [
        _notice(event, kind, i, deadline=deadline, detail=f"{d.event_type_category}:{d.event_type_code}")
        for i in ids
    ]
    return _act(event, kind, f"AWS Health {d.event_type_code} ({d.status_code})", *notices)


def _container_instance(event: EventBridgeModel, settings: Settings) -> Decision:
    d = ContainerInstanceDetail.model_validate(event.detail)
    kind = NoticeKind.CONTAINER_INSTANCE
    if not settings.watches(d.cluster_arn):
        return _ignore(event, kind, f"cluster {d.cluster_arn.rsplit('/', 1)[-1]} is not watched")
    update = ContainerInstanceUpdate(
        cluster_arn=d.cluster_arn,
        container_instance_arn=d.container_instance_arn,
        instance_id=d.instance_id,
        status=d.status,
        version=d.version,
        event_id=event.id,
        event_time=event.time,
    )
    return Decision(
        outcome="act",
        reason=f"container instance is {d.status}: update the instance index",
        kind=kind,
        event_id=event.id,
        index_update=update,
    )


def _lifecycle_check(event: EventBridgeModel, settings: Settings) -> Decision:
    d = LifecycleCheckDetail.model_validate(event.detail)
    notice = Notice(
        kind=NoticeKind.LIFECYCLE_CHECK,
        instance_id=d.instance_id,
        event_id=event.id,
        event_time=event.time,
        deadline=d.deadline,
        lifecycle=d.lifecycle,
        detail=d.notice_key,
    )
    return _act(event, NoticeKind.LIFECYCLE_CHECK, "tasks were still stopping: check again", notice)


def _task_event(event: EventBridgeModel) -> Decision:
    detail = event.detail if isinstance(event.detail, dict) else {}
    arn = detail.get("taskArn") if isinstance(detail.get("taskArn"), str) else None
    return Decision(
        outcome="ignore",
        reason="ECS task state changes belong to the task-events function, not the interruption queue",
        kind="task-state-change",
        event_id=event.id,
        task_arn=arn,
    )


# (source, detail-type) -> the notice kind and its parser: the one table of what SpotGuard takes.
_EVENT_TYPES: dict[tuple[str, str], tuple[NoticeKind, Callable[[EventBridgeModel, Settings], Decision]]] = {
    ("aws.ec2", "EC2 Spot Instance Interruption Warning"): (NoticeKind.SPOT_INTERRUPTION, _spot_warning),
    ("aws.ec2", "EC2 Instance Rebalance Recommendation"): (NoticeKind.REBALANCE, _rebalance),
    ("aws.ec2", "EC2 Instance State-change Notification"): (NoticeKind.INSTANCE_STATE, _state_change),
    ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"): (
        NoticeKind.LIFECYCLE_TERMINATE,
        _lifecycle,
    ),
    ("aws.health", "AWS Health Event"): (NoticeKind.HEALTH, _health),
    ("aws.ecs", "ECS Container Instance State Change"): (NoticeKind.CONTAINER_INSTANCE, _container_instance),
    (SOURCE, LIFECYCLE_CHECK): (NoticeKind.LIFECYCLE_CHECK, _lifecycle_check),
}

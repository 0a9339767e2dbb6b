"""What the interruption function works with: the notices an event is classified into (`Notice`, its kind,
its lifecycle action), the decision on an event (`Decision`: act, ignore or reject; made by
`classify.py`), `actions`, the one statement of what is done for each kind of notice (the use case takes
its branches from it and `explain` prints it), what was done (`NoticeOutcome`), and the ledger's view of
a host that the interruption use case reads (`HostRecord`, `HostClaim`). Pure: no boto3, no clock.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spotguard.domain.settings import RebalanceMode, Settings
from spotguard.domain.tasks import ContainerInstanceRef

SPOT_WARNING_SECONDS = 120


class NoticeKind(StrEnum):
    SPOT_INTERRUPTION = "spot-interruption"
    REBALANCE = "rebalance-recommendation"
    INSTANCE_STATE = "instance-state-change"
    LIFECYCLE_TERMINATE = "lifecycle-terminate"
    HEALTH = "health-maintenance"
    CONTAINER_INSTANCE = "container-instance-change"
    LIFECYCLE_CHECK = "lifecycle-check"


class Action(StrEnum):
    """What the interruption use case does for a notice, in order."""

    RECORD = "record-notice"
    INDEX = "index-container-instance"
    DRAIN = "drain-container-instance"
    STOP_TASKS = "stop-managed-tasks"
    CHECKPOINT_TASKS = "signal-managed-tasks-SIGUSR1"
    HEARTBEAT = "heartbeat-lifecycle-action"
    COMPLETE_LIFECYCLE = "complete-lifecycle-action-when-stopped"
    POOL_FACT = "record-rebalance-on-pool"  # after the signals: a risk signal on the host's pool


class LifecycleRef(BaseModel):
    model_config = ConfigDict(frozen=True)
    group: str
    hook: str
    token: str


class Notice(BaseModel):
    """One instance that is going away (or at risk), from one event."""

    model_config = ConfigDict(frozen=True)
    kind: NoticeKind
    instance_id: str
    event_id: str
    event_time: datetime
    deadline: datetime | None = Field(description="when the instance is expected to go; None = not known")
    detail: str = ""
    lifecycle: LifecycleRef | None = None

    @property
    def key(self) -> str:
        """Identity of this notice: the same event delivered again has the same key."""
        return f"{self.kind}#{self.event_id}#{self.instance_id}"


class ContainerInstanceUpdate(BaseModel):
    """An ECS container instance changed: keeps the instance -> container instance index current."""

    model_config = ConfigDict(frozen=True)
    cluster_arn: str
    container_instance_arn: str
    instance_id: str
    status: str
    version: int
    event_id: str
    event_time: datetime


class HostClaim(BaseModel):
    """Which notice holds the right to stop a host's tasks, and the tasks it named (ledger's CLAIM#STOP)."""

    model_config = ConfigDict(frozen=True)
    notice_key: str
    cluster_arn: str = ""
    task_arns: tuple[str, ...] = ()


class HostRecord(BaseModel):
    """What the ledger holds for an instance, read in one query before a notice acts: its container
    instance (the index), the stop claim, and the outcome of this very notice if it was handled already."""

    model_config = ConfigDict(frozen=True)
    container_instance: ContainerInstanceRef | None = None
    claim: HostClaim | None = None
    outcome: dict[str, Any] | None = None


class NoticeInProgress(RuntimeError):
    """The same notice is being handled elsewhere right now (its lease is live): retry it later."""


class Decision(BaseModel):
    """The one outcome of one event."""

    model_config = ConfigDict(frozen=True)
    outcome: Literal["act", "ignore", "reject"]
    reason: str
    kind: str | None = None
    event_id: str | None = None
    notices: tuple[Notice, ...] = ()
    index_update: ContainerInstanceUpdate | None = None
    task_arn: str | None = None

    @property
    def instance_ids(self) -> list[str]:
        if self.index_update is not None:
            return [self.index_update.instance_id]
        return [n.instance_id for n in self.notices]


def actions(kind: str, settings: Settings) -> list[Action]:
    """What the interruption use case does for a notice of this kind, in order. The one source of these
    rules: the use case takes its branches from this list, and `explain` prints it."""
    if kind == NoticeKind.LIFECYCLE_CHECK:
        return [Action.HEARTBEAT, Action.COMPLETE_LIFECYCLE]
    if kind == NoticeKind.REBALANCE and settings.rebalance is RebalanceMode.CHECKPOINT:
        return [Action.RECORD, Action.CHECKPOINT_TASKS, Action.POOL_FACT]
    steps = [Action.RECORD, Action.DRAIN, Action.STOP_TASKS]
    if kind == NoticeKind.REBALANCE:
        steps += [Action.POOL_FACT]
    if kind == NoticeKind.LIFECYCLE_TERMINATE:
        steps += [Action.HEARTBEAT, Action.COMPLETE_LIFECYCLE]
    return steps


def planned_actions(decision: Decision, settings: Settings) -> list[str]:
    """The actions the interruption function takes for a decision, in order (what `explain` prints)."""
    if decision.outcome != "act":
        return []
    if decision.index_update is not None:
        return [str(Action.INDEX)]
    return [str(s) for s in actions(decision.kind or "", settings)]


class NoticeOutcome(BaseModel):
    """What was done for one notice: logged, counted, stored in the ledger, printed by the demo."""

    notice_key: str
    kind: str
    instance_id: str
    cluster_arn: str | None = None
    container_instance_arn: str | None = None
    drained: bool = False
    signal: Literal["stop", "SIGUSR1"] | None = None
    signalled: list[str] = Field(default_factory=list)
    skipped: str | None = None
    lifecycle: Literal["completed", "waiting"] | None = None
    signal_latency_seconds: float | None = None
    pool_facts: list[str] = Field(default_factory=list)  # the pools a rebalance fact was kept on
    pool_fact_error: str | None = None  # why it could not be kept (the notice is handled all the same)
    # a notice handled already (delivered again): the outcome stored then, nothing done now, and so
    # nothing counted again in the metrics (adapters.metrics.count_outcome)
    repeat: bool = False

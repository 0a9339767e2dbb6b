"""On interruption: drain the doomed host and make every managed task on it checkpoint.

Safe to repeat: the same notice again (Powertools idempotency in the runtime keeps two copies from running
at once) re-does only what is left; a second notice for the same host (the warning, then the state change)
finds the host claimed and stops nothing again. ECS drains are idempotent; tasks already asked to stop
are no longer listed as desired-RUNNING, so a retry never stops a task twice.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from spotguard.domain.notices import Action, ContainerInstanceUpdate, Notice, Settings, actions
from spotguard.domain.tasks import ContainerInstanceRef, ManageMode, TaskInfo, managed_tasks
from spotguard.ports import Ecs, FollowUps, InterruptionLedger, Lifecycle, Signaller

MAX_PARALLEL_SIGNALS = 16


class InterruptionConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    settings: Settings = Settings()
    manage: ManageMode = ManageMode.TAGGED
    lifecycle_wait_seconds: int = Field(default=900, ge=0, le=7200)
    lifecycle_check_seconds: int = Field(default=20, ge=0, le=900)


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


def stop_reason(notice: Notice) -> str:
    """The StopTask reason: names the notice, so the task-events function knows who stopped the task."""
    return f"SpotGuard: {notice.kind} {notice.event_id} on {notice.instance_id}"[:255]


class InterruptionService:
    def __init__(
        self,
        config: InterruptionConfig,
        ecs: Ecs,
        signaller: Signaller,
        lifecycle: Lifecycle,
        follow_ups: FollowUps,
        ledger: InterruptionLedger,
        clock: Callable[[], datetime],
    ) -> None:
        self.config = config
        self.ecs = ecs
        self.signaller = signaller
        self.lifecycle = lifecycle
        self.follow_ups = follow_ups
        self.ledger = ledger
        self.clock = clock

    # ------------------------------------------------------------------------------------------ index
    def index(self, update: ContainerInstanceUpdate) -> bool:
        """Keep the instance -> container instance index; stale (lower version) updates are dropped."""
        return self.ledger.index_container_instance(update)

    # ----------------------------------------------------------------------------------------- notice
    def handle(self, notice: Notice) -> NoticeOutcome:
        """Carry out the notice's actions (`domain.notices.actions`: what `explain` prints, too)."""
        steps = actions(notice.kind, self.config.settings)
        if Action.RECORD not in steps:  # the follow-up of a held lifecycle action
            return self._lifecycle_check(notice)
        received = self.clock()
        self.ledger.record_notice(notice, received)
        out = NoticeOutcome(notice_key=notice.key, kind=notice.kind, instance_id=notice.instance_id)
        ref = self._locate(notice.instance_id)
        if ref is None:
            out.skipped = "no container instance of a watched cluster runs on this instance"
            if notice.lifecycle is not None:
                self.lifecycle.complete(notice.lifecycle, notice.instance_id)
                out.lifecycle = "completed"
            self.ledger.finish_notice(notice, out.model_dump(mode="json"))
            return out
        out.cluster_arn, out.container_instance_arn = ref.cluster_arn, ref.container_instance_arn

        if Action.CHECKPOINT_TASKS in steps:
            tasks = self._managed(ref)
            if tasks:
                self.signaller.signal(notice.instance_id, tasks, "SIGUSR1")
                out.signal, out.signalled = "SIGUSR1", [t.task_arn for t in tasks]
                out.signal_latency_seconds = self._latency(notice)
            else:
                out.skipped = "no managed task on this instance"

        if Action.DRAIN in steps and ref.status != "DRAINING":
            self.ecs.drain(ref)
            out.drained = True
        holder: str = notice.key
        waiting_for: list[str] = []
        if Action.STOP_TASKS in steps:
            # The tasks go into the claim itself (one write, before the stops), so that a redelivery
            # after a partial failure knows every task this notice stopped, not only the ones it stops.
            tasks = self._managed(ref)
            claimed, stopping = self.ledger.claim_host(
                notice.instance_id, notice.key, received, ref.cluster_arn, [t.task_arn for t in tasks]
            )
            if claimed is None:
                self._stop_all(tasks, stop_reason(notice))
                out.signal, out.signalled = "stop", stopping
                if tasks:
                    out.signal_latency_seconds = self._latency(notice)
                elif not stopping:
                    out.skipped = "no managed task on this instance"
            else:
                holder = claimed
                out.skipped = f"managed tasks were already stopped for notice {holder}"
            waiting_for = stopping  # ours, or what the holding notice stops: written before its stops

        if Action.COMPLETE_LIFECYCLE in steps and notice.lifecycle is not None:
            if not waiting_for:
                self.lifecycle.complete(notice.lifecycle, notice.instance_id)
                out.lifecycle = "completed"
            else:
                deadline = notice.event_time + timedelta(seconds=self.config.lifecycle_wait_seconds)
                self.lifecycle.heartbeat(notice.lifecycle, notice.instance_id)
                self.follow_ups.lifecycle_check(
                    notice.instance_id,
                    notice.lifecycle,
                    deadline,
                    holder,
                    self.config.lifecycle_check_seconds,
                )
                out.lifecycle = "waiting"
        self.ledger.finish_notice(notice, out.model_dump(mode="json"))
        return out

    # ------------------------------------------------------------------------------------- internals
    def _locate(self, instance_id: str) -> ContainerInstanceRef | None:
        ref = self.ledger.container_instance(instance_id)
        if ref is not None and self.config.settings.watches(ref.cluster_arn):
            return ref
        ref = self.ecs.find_container_instance(instance_id, self.config.settings.clusters)
        if ref is not None:
            self.ledger.remember_container_instance(ref)
        return ref

    def _managed(self, ref: ContainerInstanceRef) -> list[TaskInfo]:
        """ListTasks says which tasks are desired RUNNING on the host (the truth); the task index,
        kept from task events, describes them; only tasks it does not know yet are described."""
        arns = self.ecs.running_task_arns(ref)
        if not arns:
            return []
        known = self.ledger.indexed_tasks(ref.container_instance_arn)
        unknown = [a for a in arns if a not in known]
        described = self.ecs.describe_tasks(ref.cluster_arn, unknown) if unknown else []
        tasks = [known[a] for a in arns if a in known] + [
            t for t in described if t.desired_status == "RUNNING"
        ]
        return managed_tasks(tasks, self.config.manage, self.ecs.definition_has_gpu)

    def _stop_all(self, tasks: list[TaskInfo], reason: str) -> None:
        """StopTask for every task at once: with the two-minute warning, serial calls would eat the
        checkpoint window. Every task is tried; the first failure is raised afterwards so the notice is
        retried, and the retry lists only the tasks that are still desired RUNNING."""
        if not tasks:
            return
        if len(tasks) == 1:
            self.ecs.stop_task(tasks[0].cluster_arn, tasks[0].task_arn, reason)
            return
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_SIGNALS, len(tasks))) as pool:
            futures = [pool.submit(self.ecs.stop_task, t.cluster_arn, t.task_arn, reason) for t in tasks]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]  # type: ignore[misc]

    def _latency(self, notice: Notice) -> float:
        return max(0.0, (self.clock() - notice.event_time).total_seconds())

    def _lifecycle_check(self, notice: Notice) -> NoticeOutcome:
        assert notice.lifecycle is not None and notice.deadline is not None
        holder = notice.detail
        out = NoticeOutcome(notice_key=notice.key, kind=notice.kind, instance_id=notice.instance_id)
        cluster_arn, task_arns = self.ledger.claimed_tasks(notice.instance_id)
        stopped = set(self.ecs.stopped(cluster_arn, task_arns)) if task_arns else set()
        still = [a for a in task_arns if a not in stopped]
        if not still or self.clock() >= notice.deadline:
            self.lifecycle.complete(notice.lifecycle, notice.instance_id)
            out.lifecycle = "completed"
            if still:
                out.skipped = f"deadline passed with {len(still)} task(s) still stopping"
        else:
            self.lifecycle.heartbeat(notice.lifecycle, notice.instance_id)
            self.follow_ups.lifecycle_check(
                notice.instance_id,
                notice.lifecycle,
                notice.deadline,
                holder,
                self.config.lifecycle_check_seconds,
            )
            out.lifecycle = "waiting"
            out.signalled = still
        return out

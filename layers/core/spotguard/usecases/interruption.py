"""On interruption: drain the doomed host and make every managed task on it checkpoint.

The path to the last signal is kept as short as the ledger allows. For a spot warning on a host with N
managed tasks: one query reads the host's items (container instance, stop claim, this notice's record);
ListTasks and the host's task index (a query) go out side by side; one conditional write claims the host,
names the tasks and takes this try's lease; then the N StopTasks go out side by side, with the drain
beside them. The notice's record is written after the signals. Four calls before the signals, whatever N.

Safe to repeat: a notice whose record holds an outcome returns it at once; two copies of one notice in
flight at the same time meet at the claim (or, for SIGUSR1, the notice's lease), and the later one is
retried (NoticeInProgress); a second notice for the same host (the warning, then the state change) finds
the host claimed, by the first query, and stops nothing again. ECS drains are idempotent; tasks already
asked to stop are no longer listed as desired-RUNNING, so a retry never stops a task twice.

A rebalance recommendation also becomes a "rebalance" fact on the pool the host is in (`RebalanceFacts`),
after its signals (a spot warning has no such step, so its path is as above). The fact carries the
event's time and the instance, so a redelivery folds in nothing new; a failure to keep it is logged and
named in the outcome (`pool_fact_error`, counted as a metric), and fails nothing.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from spotguard.domain.interruption.notices import (
    Action,
    ContainerInstanceUpdate,
    HostRecord,
    LifecycleRef,
    Notice,
    NoticeOutcome,
    actions,
)
from spotguard.domain.settings import Settings
from spotguard.domain.tasks import ContainerInstanceRef, ManageMode, TaskInfo, managed_tasks
from spotguard.ports import Ecs, FollowUps, InterruptionLedger, Lifecycle, RebalanceFacts, Signaller

log = logging.getLogger(__name__)

# AWS calls one process keeps in flight for notices at once (stops, drains, listings). Within the clients'
# connection pool (adapters/clients.py URGENT: max_pool_connections), so no call waits for a connection or
# opens one that the pool then throws away.
MAX_PARALLEL_CALLS = 32


class InterruptionConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    settings: Settings = Settings()
    manage: ManageMode = ManageMode.TAGGED
    lifecycle_wait_seconds: int = Field(default=900, ge=0, le=7200)
    lifecycle_check_seconds: int = Field(default=20, ge=0, le=900)
    # How long a try of a notice holds its lease when the caller does not say (the function's timeout):
    # a try that died is taken over once it has run out.
    lease_seconds: float = Field(default=30, gt=0, le=900)
    max_parallel_calls: int = Field(default=MAX_PARALLEL_CALLS, ge=1, le=256)


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
        pool_facts: RebalanceFacts | None = None,
    ) -> None:
        self.config = config
        self.pool_facts = pool_facts
        self.ecs = ecs
        self.signaller = signaller
        self.lifecycle = lifecycle
        self.follow_ups = follow_ups
        self.ledger = ledger
        self.clock = clock
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ index
    def index(self, update: ContainerInstanceUpdate) -> bool:
        """Keep the instance -> container instance index; stale (lower version) updates are dropped."""
        return self.ledger.index_container_instance(update)

    # ----------------------------------------------------------------------------------------- notice
    def handle(self, notice: Notice, lease_seconds: float | None = None) -> NoticeOutcome:
        """Carry out the notice's actions (`domain.interruption.notices.actions`: what `explain` prints,
        too). `lease_seconds`: how long this try may hold the notice (the invocation's remaining time)."""
        steps = actions(notice.kind, self.config.settings)
        if Action.RECORD not in steps:  # the follow-up of a held lifecycle action
            return self._lifecycle_check(notice)
        received = self.clock()
        owner = uuid.uuid4().hex  # this try: the lease names it
        lease_until = received + timedelta(seconds=lease_seconds or self.config.lease_seconds)
        host = self.ledger.host(notice.instance_id, notice.key)
        if host.outcome is not None:  # this notice was handled already: a repeat does nothing
            return NoticeOutcome.model_validate({**host.outcome, "repeat": True})
        out = NoticeOutcome(notice_key=notice.key, kind=notice.kind, instance_id=notice.instance_id)
        ref = self._locate(notice.instance_id, host.container_instance)
        if ref is None:
            out.skipped = "no container instance of a watched cluster runs on this instance"
            if notice.lifecycle is not None:
                self.lifecycle.complete(notice.lifecycle, notice.instance_id)
                out.lifecycle = "completed"
            self.ledger.finish_notice(notice, received, out.model_dump(mode="json"))
            return out
        out.cluster_arn, out.container_instance_arn = ref.cluster_arn, ref.container_instance_arn
        drain = Action.DRAIN in steps and ref.status != "DRAINING"
        if Action.CHECKPOINT_TASKS in steps:
            self.ledger.lease_notice(notice, owner, received, lease_until)
            self._checkpoint(notice, ref, out)
        holder: str = notice.key
        waiting_for: list[str] = []
        if Action.STOP_TASKS in steps:
            lease = (received, owner, lease_until)
            holder, waiting_for, drain = self._stop(notice, host, ref, drain, lease, out)
        if drain:
            self.ecs.drain(ref)
            out.drained = True
        if Action.POOL_FACT in steps:
            self._record_pool_fact(notice, ref, out)
        if Action.COMPLETE_LIFECYCLE in steps and notice.lifecycle is not None:
            self._hold_or_complete(notice, notice.lifecycle, holder, waiting_for, out)
        self.ledger.finish_notice(notice, received, out.model_dump(mode="json"))
        return out

    def _checkpoint(self, notice: Notice, ref: ContainerInstanceRef, out: NoticeOutcome) -> None:
        """SIGUSR1 to the managed tasks on the host: a checkpoint now, no stop."""
        tasks = self._managed(ref)
        if tasks:
            self.signaller.signal(notice.instance_id, tasks, "SIGUSR1")
            out.signal, out.signalled = "SIGUSR1", [t.task_arn for t in tasks]
            out.signal_latency_seconds = self._latency(notice)
        else:
            out.skipped = "no managed task on this instance"

    def _stop(
        self,
        notice: Notice,
        host: HostRecord,
        ref: ContainerInstanceRef,
        drain: bool,
        lease: tuple[datetime, str, datetime],
        out: NoticeOutcome,
    ) -> tuple[str, list[str], bool]:
        """Claim the host and stop its managed tasks (and drain it beside them), unless another notice
        holds it. Returns the notice that holds the host, the tasks it stops (written before its stops),
        and whether the drain is still to be done."""
        received, owner, lease_until = lease
        tasks: list[TaskInfo] = []
        claimed: str | None
        if host.claim is not None and host.claim.notice_key != notice.key:
            # Another notice holds the host (the query said so): nothing to list, nothing to stop.
            claimed, stopping = host.claim.notice_key, list(host.claim.task_arns)
        else:
            # The tasks go into the claim itself (one write, before the stops), so that a redelivery
            # after a partial failure knows every task this notice stopped, not only the ones it stops.
            tasks = self._managed(ref)
            claimed, stopping = self.ledger.claim_host(
                notice.instance_id,
                notice.key,
                received,
                ref.cluster_arn,
                [t.task_arn for t in tasks],
                owner,
                lease_until,
            )
        if claimed is not None:
            out.skipped = f"managed tasks were already stopped for notice {claimed}"
            return claimed, stopping, drain
        self._stop_all(tasks, stop_reason(notice), ref if drain else None)
        out.drained = drain
        out.signal, out.signalled = "stop", stopping
        if tasks:
            out.signal_latency_seconds = self._latency(notice)
        elif not stopping:
            out.skipped = "no managed task on this instance"
        return notice.key, stopping, False

    def _hold_or_complete(
        self, notice: Notice, ref: LifecycleRef, holder: str, waiting_for: list[str], out: NoticeOutcome
    ) -> None:
        """The lifecycle action: completed when no task is left to stop, else held (a heartbeat) and
        checked again by a follow-up until the tasks have stopped or the wait is over."""
        if not waiting_for:
            self.lifecycle.complete(ref, notice.instance_id)
            out.lifecycle = "completed"
            return
        deadline = notice.event_time + timedelta(seconds=self.config.lifecycle_wait_seconds)
        self.lifecycle.heartbeat(ref, notice.instance_id)
        self.follow_ups.lifecycle_check(
            notice.instance_id, ref, deadline, holder, self.config.lifecycle_check_seconds
        )
        out.lifecycle = "waiting"

    def _locate(self, instance_id: str, indexed: ContainerInstanceRef | None) -> ContainerInstanceRef | None:
        if indexed is not None and self.config.settings.watches(indexed.cluster_arn):
            return indexed
        ref = self.ecs.find_container_instance(instance_id, self.config.settings.clusters)
        if ref is not None:
            self.ledger.remember_container_instance(ref)
        return ref

    def _side_by_side(self, *calls: Callable[[], Any]) -> list[Future[Any]]:
        """Start calls on the shared pool; wait for all of them; the first failure is raised after all
        have finished (so that every stop is tried), the results otherwise returned in order."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.config.max_parallel_calls, thread_name_prefix="spotguard-call"
                )
            pool = self._pool
        # each call runs in a copy of its caller's context, so its logs keep the notice's correlation id
        futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]
        return futures

    def _managed(self, ref: ContainerInstanceRef) -> list[TaskInfo]:
        """ListTasks says which tasks are desired RUNNING on the host (the truth); the task index,
        kept from task events, describes them (both asked at once); only tasks it does not know yet are
        described."""
        listed, indexed = self._side_by_side(
            lambda: self.ecs.running_task_arns(ref),
            lambda: self.ledger.indexed_tasks(ref.container_instance_arn),
        )
        arns: list[str] = listed.result()
        if not arns:
            return []
        known: dict[str, TaskInfo] = indexed.result()
        unknown = [a for a in arns if a not in known]
        described = self.ecs.describe_tasks(ref.cluster_arn, unknown) if unknown else []
        tasks = [known[a] for a in arns if a in known] + [
            t for t in described if t.desired_status == "RUNNING"
        ]
        return managed_tasks(tasks, self.config.manage, self.ecs.definition_has_gpu)

    def _stop_all(self, tasks: list[TaskInfo], reason: str, drain: ContainerInstanceRef | None) -> None:
        """StopTask for every task at once, and the drain beside them: with the two-minute warning,
        serial calls would eat the checkpoint window, and nothing on the path waits for the drain. Every
        call is tried; the first failure is raised afterwards so the notice is retried, and the retry
        lists only the tasks that are still desired RUNNING."""
        calls: list[Callable[[], Any]] = [
            (lambda t=t: self.ecs.stop_task(t.cluster_arn, t.task_arn, reason)) for t in tasks
        ]
        if drain is not None:
            calls.append(lambda: self.ecs.drain(drain))
        if len(calls) == 1:
            calls[0]()
        elif calls:
            self._side_by_side(*calls)

    def _record_pool_fact(self, notice: Notice, ref: ContainerInstanceRef, out: NoticeOutcome) -> None:
        """The rebalance recommendation on the host's pool, after every signal. What it costs when it
        fails is a little of the policy's knowledge, never the notice: logged, and said in the outcome."""
        if self.pool_facts is None:
            return
        try:
            out.pool_facts = self.pool_facts.record_rebalance(ref, notice.instance_id, notice.event_time)
        except Exception as exc:
            out.pool_fact_error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning(
                "notice %s: the rebalance fact was not kept on the pool of %s",
                notice.key,
                ref.container_instance_arn,
                exc_info=True,
            )

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

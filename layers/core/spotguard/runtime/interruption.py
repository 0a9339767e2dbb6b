"""The interruption function's runtime: the urgent path, and nothing of the jobs path.

No Powertools idempotency here: the ledger does that work on the path itself. A notice whose record holds
an outcome is not acted on again (the first query of the path reads it), and two copies of one notice in
flight at once meet at the host's claim, a conditional write the path makes anyway, which carries the
lease of the try that holds it (for SIGUSR1, the notice's own record carries it). That saves the two
idempotency-table calls that stood before and after every notice.
"""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType

from spotguard.adapters.autoscaling import LifecycleAdapter
from spotguard.adapters.clients import LazyClient, client
from spotguard.adapters.ecs import EcsAdapter
from spotguard.adapters.ledger import DynamoLedger
from spotguard.adapters.queues import DeadLetters, FollowUpQueue
from spotguard.adapters.ssm import SsmSignaller
from spotguard.domain.interruption.notices import Notice, NoticeOutcome
from spotguard.domain.tasks import ContainerInstanceRef
from spotguard.runtime import utcnow
from spotguard.runtime.config import InterruptionEnv
from spotguard.usecases.interruption import InterruptionConfig, InterruptionService

if TYPE_CHECKING:
    from spotguard.usecases.pools import PoolRebalanceFacts

# What a try of a notice keeps in hand when it takes its lease: the time left to answer the batch. A try
# that is cut off (the function's timeout) is taken over by the redelivery once its lease has run out.
LEASE_MARGIN_SECONDS = 1.0


class InterruptionRuntime:
    def __init__(self, env: InterruptionEnv) -> None:
        self.env = env
        self.settings = env.settings
        sqs = LazyClient("sqs")
        self.ledger = DynamoLedger(client("dynamodb"), env.ledger_table)
        ecs = EcsAdapter(client("ecs"))
        self.pool_facts = LazyRebalanceFacts(ecs, client("dynamodb"), env.ledger_table)
        self.service = InterruptionService(
            config=InterruptionConfig(
                settings=env.settings,
                manage=env.manage,
                lifecycle_wait_seconds=env.lifecycle_wait_seconds,
                lifecycle_check_seconds=env.lifecycle_check_seconds,
            ),
            ecs=ecs,
            signaller=SsmSignaller(LazyClient("ssm"), env.signal_document),
            lifecycle=LifecycleAdapter(LazyClient("autoscaling")),
            follow_ups=FollowUpQueue(sqs, env.queue_url),
            ledger=self.ledger,
            clock=utcnow,
            pool_facts=self.pool_facts,
        )
        self.dead_letters = DeadLetters(sqs, env.dead_letter_url)
        self._context: Any = None

    def handle_notice(self, notice: Notice) -> NoticeOutcome:
        return self.service.handle(notice, lease_seconds=self._lease_seconds())

    def register_context(self, context: Any) -> None:
        self._context = context

    def _lease_seconds(self) -> float | None:
        remaining = getattr(self._context, "get_remaining_time_in_millis", None)
        if remaining is None:
            return None
        return max(LEASE_MARGIN_SECONDS, remaining() / 1000 + LEASE_MARGIN_SECONDS)


class LazyRebalanceFacts:
    """The pools' side of a rebalance recommendation (usecases.pools.PoolRebalanceFacts over the ledger's
    pools), built at the first one: a cold start of the urgent function loads nothing of the pools."""

    def __init__(self, ecs: EcsAdapter, dynamodb: Any, table: str) -> None:
        self.ecs, self.dynamodb, self.table = ecs, dynamodb, table
        self._facts: PoolRebalanceFacts | None = None
        self._lock = threading.Lock()

    def record_rebalance(self, ref: ContainerInstanceRef, instance_id: str, at: datetime) -> list[str]:
        with self._lock:
            if self._facts is None:
                from spotguard.adapters.pool_store import DynamoPoolStore
                from spotguard.usecases.pools import PoolRebalanceFacts

                self._facts = PoolRebalanceFacts(self.ecs, DynamoPoolStore(self.dynamodb, self.table), utcnow)
            facts = self._facts
        return facts.record_rebalance(ref, instance_id, at)


class ParallelBatchProcessor(BatchProcessor):
    """Powertools' BatchProcessor, with the records of a batch handled side by side (one thread each, up
    to the batch size of 10) instead of one after the other. Success and failure are still reported per
    record; the record handler must be thread-safe (the interruption function's is: boto3 clients are,
    and the use case keeps no state per notice outside its call)."""

    def __init__(self, event_type: EventType, max_workers: int = 10) -> None:
        super().__init__(event_type=event_type)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="spotguard-record")

    def process(self) -> list[tuple[Any, ...]]:
        if len(self.records) <= 1:
            return super().process()
        # each record runs in its own copy of the invocation's context (log keys, correlation id)
        contexts = [contextvars.copy_context() for _ in self.records]
        return list(self._pool.map(lambda c, r: c.run(self._process_record, r), contexts, self.records))


class ThreadLogger(Logger):
    """Powertools' Logger whose correlation id is kept per thread, so that records handled side by side
    each log under their own event's id."""

    def set_correlation_id(self, value: str | None) -> None:
        self.thread_safe_append_keys(correlation_id=value)

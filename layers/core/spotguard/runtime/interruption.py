"""The interruption function's runtime: the urgent path, and nothing of the jobs path."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from spotguard.adapters.autoscaling import LifecycleAdapter
from spotguard.adapters.clients import LazyClient, client
from spotguard.adapters.ecs import EcsAdapter
from spotguard.adapters.ledger import DynamoLedger
from spotguard.adapters.queues import DeadLetters, FollowUpQueue
from spotguard.adapters.ssm import SsmSignaller
from spotguard.config import InterruptionEnv
from spotguard.domain.notices import Notice
from spotguard.runtime import utcnow
from spotguard.usecases.interruption import InterruptionConfig, InterruptionService

NOTICE_IDEMPOTENCY_SECONDS = 24 * 3600  # a redelivered notice, even hours later, is not acted on twice


class InterruptionRuntime:
    def __init__(self, env: InterruptionEnv) -> None:
        self.env = env
        self.settings = env.settings
        sqs = LazyClient("sqs")
        self.ledger = DynamoLedger(client("dynamodb"), env.ledger_table)
        self.service = InterruptionService(
            config=InterruptionConfig(
                settings=env.settings,
                manage=env.manage,
                lifecycle_wait_seconds=env.lifecycle_wait_seconds,
                lifecycle_check_seconds=env.lifecycle_check_seconds,
            ),
            ecs=EcsAdapter(client("ecs")),
            signaller=SsmSignaller(LazyClient("ssm"), env.signal_document),
            lifecycle=LifecycleAdapter(LazyClient("autoscaling")),
            follow_ups=FollowUpQueue(sqs, env.queue_url),
            ledger=self.ledger,
            clock=utcnow,
        )
        self.dead_letters = DeadLetters(sqs, env.dead_letter_url)
        self.idempotency = IdempotencyConfig(
            event_key_jmespath="[kind, event_id, instance_id]",
            expires_after_seconds=NOTICE_IDEMPOTENCY_SECONDS,
            raise_on_no_idempotency_key=True,
        )
        store = DynamoDBPersistenceLayer(table_name=env.idempotency_table, boto3_client=client("dynamodb"))
        # Same notice key in flight elsewhere -> IdempotencyAlreadyInProgressError -> the record is retried.
        self.handle_notice = idempotent_function(
            data_keyword_argument="notice", persistence_store=store, config=self.idempotency
        )(self._handle_notice)

    def _handle_notice(self, notice: Notice) -> dict[str, Any]:
        return self.service.handle(notice).model_dump(mode="json")

    def register_context(self, context: Any) -> None:
        self.idempotency.register_lambda_context(context)

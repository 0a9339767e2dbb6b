"""Composition root for the Lambdas: build the adapters from the environment once per cold start, and
wrap the use cases in Powertools idempotency. Handlers in functions/ import from here and stay thin."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from spotguard.adapters.autoscaling import LifecycleAdapter
from spotguard.adapters.clients import LazyClient, client
from spotguard.adapters.ebs import EbsAdapter
from spotguard.adapters.ecs import EcsAdapter
from spotguard.adapters.hosts import Ec2Hosts
from spotguard.adapters.job_store import DynamoJobs
from spotguard.adapters.ledger import DynamoLedger
from spotguard.adapters.notify import Notifier
from spotguard.adapters.queues import DeadLetters, FollowUpQueue, RetryQueue
from spotguard.adapters.s3 import S3Checkpoints
from spotguard.adapters.ssm import SsmSignaller
from spotguard.config import CheckpointsEnv, InterruptionEnv, JobsEnv
from spotguard.domain.commands import Submit
from spotguard.domain.notices import Notice
from spotguard.usecases.checkpoints import CheckpointService
from spotguard.usecases.interruption import InterruptionConfig, InterruptionService
from spotguard.usecases.jobs.ebs import EbsVolumes
from spotguard.usecases.jobs.engine import JobEngine, JobsConfig
from spotguard.usecases.jobs.reconcile import Reconciler
from spotguard.usecases.jobs.service import JobService, summary

NOTICE_IDEMPOTENCY_SECONDS = 24 * 3600  # a redelivered notice, even hours later, is not acted on twice
SUBMIT_IDEMPOTENCY_SECONDS = 600  # the same submit payload again within 10 minutes: the same job


def utcnow() -> datetime:
    return datetime.now(UTC)


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
            signaller=SsmSignaller(LazyClient("ssm")),
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


class CheckpointsRuntime:
    def __init__(self, env: CheckpointsEnv) -> None:
        self.env = env
        self.ledger = DynamoLedger(client("dynamodb"), env.ledger_table)
        self.service = CheckpointService(S3Checkpoints(client("s3")), self.ledger)
        self.dead_letters = DeadLetters(LazyClient("sqs"), env.dead_letter_url)


class JobsRuntime:
    """The job use case for the task-events function and the jobs function."""

    def __init__(self, env: JobsEnv) -> None:
        self.env = env
        self.settings = env.settings
        dynamodb, ecs, sqs = client("dynamodb"), client("ecs"), LazyClient("sqs")
        ledger = DynamoLedger(dynamodb, env.ledger_table)
        self.clock = utcnow  # every part of the jobs path reads the time through `now` (tests move it)
        volumes = EbsVolumes(EbsAdapter(LazyClient("ec2")), self.now)
        engine = JobEngine(
            config=JobsConfig(
                settings=env.settings,
                manage=env.manage,
                checkpoint_bucket=env.checkpoint_bucket,
                default_subnets=env.default_subnets,
                default_security_groups=env.default_security_groups,
                retry_base_seconds=env.retry_base_seconds,
                ebs_role_arn=env.ebs_role_arn or None,
            ),
            store=DynamoJobs(dynamodb, env.ledger_table),
            ecs=EcsAdapter(ecs),
            checkpoints=CheckpointService(S3Checkpoints(LazyClient("s3")), ledger),
            notifier=Notifier(LazyClient("sns"), LazyClient("events"), env.topic_arn),
            retries=RetryQueue(sqs, env.retry_queue_url),
            clock=self.now,
            volumes=volumes,
        )
        self.service = JobService(
            engine, hosts=Ec2Hosts(ecs, LazyClient("ec2")), claims=ledger, index=ledger, volumes=volumes
        )
        self.reconciler = Reconciler(self.service)
        self.dead_letters = DeadLetters(sqs, env.dead_letter_url)
        self.idempotency = IdempotencyConfig(expires_after_seconds=SUBMIT_IDEMPOTENCY_SECONDS)
        store = DynamoDBPersistenceLayer(table_name=env.idempotency_table, boto3_client=dynamodb)
        # A submit repeated with the same payload (a CLI retry after a timeout) makes one job, not two.
        self.submit = idempotent_function(
            data_keyword_argument="cmd", persistence_store=store, config=self.idempotency
        )(self._submit)

    def now(self) -> datetime:
        return self.clock()

    def _submit(self, cmd: Submit) -> dict[str, Any]:
        return summary(self.service.submit(cmd))

    def register_context(self, context: Any) -> None:
        self.idempotency.register_lambda_context(context)

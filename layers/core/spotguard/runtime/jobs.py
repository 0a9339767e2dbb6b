"""The jobs path's runtime: the task-events, jobs and reconcile functions all run the jobs use cases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from spotguard.adapters.autoscaling import AsgSpares
from spotguard.adapters.clients import LazyClient, client
from spotguard.adapters.ebs import EbsAdapter
from spotguard.adapters.hosts import Ec2Hosts
from spotguard.adapters.job_ecs import JobEcsAdapter
from spotguard.adapters.job_metrics import MeteredNotifications, SpendMeter
from spotguard.adapters.job_store import DynamoJobStore
from spotguard.adapters.ledger import DynamoLedger
from spotguard.adapters.notify import Notifier
from spotguard.adapters.pool_store import DynamoPoolStore
from spotguard.adapters.pools import PoolDiscovery
from spotguard.adapters.queues import DeadLetters, RetryQueue
from spotguard.adapters.s3 import S3Checkpoints
from spotguard.adapters.ssm import SsmSignaller
from spotguard.domain.jobs.answers import JobSummary
from spotguard.domain.jobs.commands import Submit
from spotguard.runtime import utcnow
from spotguard.runtime.config import JobsEnv
from spotguard.usecases.checkpoints import CheckpointService
from spotguard.usecases.jobs.advisor import PlacementAdvisor
from spotguard.usecases.jobs.ebs import EbsVolumes
from spotguard.usecases.jobs.engine import JobEngine, JobsConfig
from spotguard.usecases.jobs.reconcile import Reconciler
from spotguard.usecases.jobs.service import JobService
from spotguard.usecases.jobs.spares import Spares
from spotguard.usecases.pools import PoolService

SUBMIT_IDEMPOTENCY_SECONDS = 600  # the same submit payload again within 10 minutes: the same job


class JobsRuntime:
    """The job use case for the task-events function and the jobs function."""

    def __init__(self, env: JobsEnv) -> None:
        self.env = env
        self.settings = env.settings
        dynamodb, ecs, sqs = client("dynamodb"), client("ecs"), LazyClient("sqs")
        ledger = DynamoLedger(dynamodb, env.ledger_table)
        self.clock = utcnow  # every part of the jobs path reads the time through `now` (tests move it)
        volumes = EbsVolumes(EbsAdapter(LazyClient("ec2")), self.now)
        store = DynamoJobStore(dynamodb, env.ledger_table)
        self.jobs = store  # reconcile counts the jobs by state in it
        self.pools = PoolService(
            PoolDiscovery(ecs, LazyClient("autoscaling"), LazyClient("ec2")),
            DynamoPoolStore(dynamodb, env.ledger_table),
            region=dynamodb.meta.region_name,
        )
        signaller = SsmSignaller(LazyClient("ssm"), env.signal_document) if env.signal_document else None
        advisor = PlacementAdvisor(self.pools, store, self.now, env.clusters)  # both capacity ports
        retries = RetryQueue(sqs, env.retry_queue_url)
        # the early replacement, with the groups the stack lists (none: off, and nothing of it runs)
        spares = (
            Spares(AsgSpares(LazyClient("autoscaling"), ecs), env.spare_groups, store, self.now, leases=store)
            if env.spare_groups
            else None
        )
        engine = JobEngine(
            config=JobsConfig(
                settings=env.settings,
                manage=env.manage,
                checkpoint_bucket=env.checkpoint_bucket,
                default_subnets=env.default_subnets,
                default_security_groups=env.default_security_groups,
                retry_base_seconds=env.retry_base_seconds,
                ebs_role_arn=env.ebs_role_arn or None,
                pass_roles=env.pass_roles,
                task_families=env.task_families,
            ),
            store=store,
            ecs=JobEcsAdapter(ecs),
            checkpoints=CheckpointService(S3Checkpoints(LazyClient("s3")), ledger),
            notifier=MeteredNotifications(Notifier(LazyClient("sns"), LazyClient("events"), env.topic_arn)),
            retries=retries,
            clock=self.now,
            volumes=volumes,
            placement=advisor,
            signaller=signaller,
            spares=spares,
            on_written=(SpendMeter(store), advisor.task_seen),
        )
        self.service = JobService(
            engine,
            hosts=Ec2Hosts(ecs, LazyClient("ec2")),
            claims=ledger,
            index=ledger,
            volumes=volumes,
            placement=advisor,
            pool_observations=advisor,
            retries=retries,
        )
        self.reconciler = Reconciler(self.service, pool_observations=advisor)
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
        # the idempotency layer keeps the answer as JSON: the summary's wire form
        return JobSummary.of(self.service.submit(cmd)).model_dump(mode="json")

    def register_context(self, context: Any) -> None:
        self.idempotency.register_lambda_context(context)

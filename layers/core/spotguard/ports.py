"""Every interface the use cases need from the outside world, in this one module, by wing: the queues,
the interruption, the jobs, the checkpoints, the bucket check and the pools. Adapters implement them with
boto3 (spotguard.adapters), the tests with fakes (tests/fakes.py), and tests/contract runs one set of cases
on both. Most are Protocols; three are classes whose default does nothing, for a stack without the part
they stand for (`VolumeEffects`: no EBS mode; `LaunchPlacement` and `PoolObservations`: no pools), which
the use cases' implementations subclass (usecases.jobs.ebs, usecases.jobs.advisor). Imports here are
types only: the interruption function loads this at its cold start, and nothing of the jobs domain."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:  # types only: the interruption function must not load the jobs domain at cold start
    from spotguard.domain.capacity.decision import PlacementDecision
    from spotguard.domain.checkpoints import CheckpointRecorded, CheckpointRef
    from spotguard.domain.interruption.notices import (
        ContainerInstanceUpdate,
        HostRecord,
        LifecycleRef,
        Notice,
    )
    from spotguard.domain.jobs.effects import Cleanup, GiveBackSpare, RaiseSpare, Transition
    from spotguard.domain.jobs.model import Job, JobState, UnreadableJob
    from spotguard.domain.jobs.replies import HostInfo, Notification, RunResult, TaskDefinitionInfo
    from spotguard.domain.jobs.task_events import PoolEvent
    from spotguard.domain.tasks import ContainerInstanceRef, TaskEvent, TaskInfo


# ----------------------------------------------------------------------------------------- queues
class DeadLetters(Protocol):
    def send(self, body: str, reason: str, source_message_id: str) -> None: ...


# ------------------------------------------------------------------------------------ interruption
class Ecs(Protocol):
    def find_container_instance(
        self, instance_id: str, clusters: Sequence[str]
    ) -> ContainerInstanceRef | None: ...
    def drain(self, ref: ContainerInstanceRef) -> None: ...
    def running_task_arns(self, ref: ContainerInstanceRef) -> list[str]: ...
    def describe_tasks(self, cluster_arn: str, arns: Sequence[str]) -> list[TaskInfo]: ...
    def stopped(self, cluster_arn: str, task_arns: Sequence[str]) -> list[str]: ...
    def definition_has_gpu(self, task_definition_arn: str) -> bool: ...
    def stop_task(self, cluster: str, task_arn: str, reason: str) -> None: ...


class Signaller(Protocol):
    def signal(self, instance_id: str, tasks: Sequence[TaskInfo], signal: str) -> str: ...


class Lifecycle(Protocol):
    def heartbeat(self, ref: LifecycleRef, instance_id: str) -> None: ...
    def complete(self, ref: LifecycleRef, instance_id: str) -> None: ...


class FollowUps(Protocol):
    def lifecycle_check(
        self, instance_id: str, ref: LifecycleRef, deadline: datetime, notice_key: str, delay_seconds: int
    ) -> None: ...


class InterruptionLedger(Protocol):
    def host(self, instance_id: str, notice_key: str) -> HostRecord: ...
    def index_container_instance(self, update: ContainerInstanceUpdate) -> bool: ...
    def remember_container_instance(self, ref: ContainerInstanceRef) -> None: ...
    def lease_notice(self, notice: Notice, owner: str, now: datetime, until: datetime) -> None: ...
    def claim_host(
        self,
        instance_id: str,
        notice_key: str,
        at: datetime,
        cluster_arn: str,
        task_arns: Sequence[str],
        owner: str,
        lease_until: datetime,
    ) -> tuple[str | None, list[str]]: ...
    def finish_notice(self, notice: Notice, received: datetime, outcome: dict[str, object]) -> None: ...
    def claimed_tasks(self, instance_id: str) -> tuple[str, list[str]]: ...
    def indexed_tasks(self, container_instance_arn: str) -> dict[str, TaskInfo]: ...


class RebalanceFacts(Protocol):
    """What the interruption path tells the pools: a rebalance recommendation for a host, as a fact on the
    pool it is in (usecases.pools.PoolRebalanceFacts). The pools' names that kept it."""

    def record_rebalance(self, ref: ContainerInstanceRef, instance_id: str, at: datetime) -> list[str]: ...


# ------------------------------------------------------------------------------------------- jobs
class JobStore(Protocol):
    def get(self, job_id: str) -> Job | None: ...
    def create(self, job: Job) -> bool: ...
    def replace(self, job: Job, expected_rev: int) -> bool: ...
    def list(
        self,
        state: JobState | None,
        limit: int,
        on_unreadable: Callable[[UnreadableJob], None] | None = None,
        oldest_first: bool = False,
    ) -> list[Job]: ...
    def known_unmanaged(self, task_arn: str) -> bool: ...
    def remember_unmanaged(self, task_arn: str, at: datetime) -> None: ...
    def checkpoints(self, prefix_uri: str) -> list[CheckpointRef]: ...


class JobEcs(Protocol):
    def check_run_task(self, params: dict[str, Any]) -> str | None: ...
    def run_task(self, params: dict[str, Any]) -> RunResult: ...
    def stop_task(self, cluster: str, task_arn: str, reason: str) -> None: ...
    def describe_task(self, cluster: str, task_arn: str) -> TaskEvent | None: ...
    def describe_many(
        self, cluster: str, task_arns: Sequence[str]
    ) -> tuple[dict[str, TaskEvent], list[str]]: ...
    def task_definition(self, arn: str, overrides: dict[str, Any] | None = None) -> TaskDefinitionInfo: ...
    def largest_gpus(self, cluster: str) -> int | None: ...


class Hosts(Protocol):
    def facts(self, cluster: str, container_instance_arn: str) -> HostInfo | None: ...


class SpareCapacity(Protocol):
    """The early replacement's instances (adapters.autoscaling.AsgSpares)."""

    def raise_one(self, group: str) -> tuple[bool, tuple[str, ...], str]: ...
    def give_back(
        self, cluster: str, group: str, before: tuple[str, ...], keep: int
    ) -> tuple[str | None, str, bool]: ...


class SpareGroupLeases(Protocol):
    """One holder at a time per Auto Scaling group for the spares' read-then-set of its desired capacity
    and their give-backs (the job store keeps the lease: adapters/job_store.py)."""

    def hold_group(self, group: str, owner: str, now: datetime, until: datetime) -> bool: ...
    def let_go_group(self, group: str, owner: str) -> None: ...


class NewestCheckpoint(Protocol):
    def newest(self, prefix_uri: str) -> CheckpointRef | None: ...


class StopClaims(Protocol):
    def stop_claim(self, instance_id: str) -> str | None: ...


class Notifications(Protocol):
    def send_all(self, notifications: list[Notification]) -> None: ...


class TaskIndex(Protocol):
    def index_task(self, info: TaskInfo, version: int, at: datetime) -> bool: ...


class Volumes(Protocol):
    def find(self, job_id: str, attempt: int) -> str | None: ...
    def snapshot(self, volume_id: str, job_id: str, attempt: int) -> str: ...
    def snapshot_state(self, snapshot_id: str) -> str | None: ...
    def snapshot_owner(self, snapshot_id: str) -> tuple[str, int] | None: ...
    def delete_volume(self, volume_id: str) -> bool: ...
    def delete_snapshot(self, snapshot_id: str) -> None: ...


class LaunchRetries(Protocol):
    def schedule(self, job_id: str, launch_try: int, delay_seconds: int) -> None: ...


class SpareEffects(Protocol):
    """The early replacement as the engine carries it out (usecases.jobs.spares.Spares)."""

    def carry(self, job: Job, effect: RaiseSpare | GiveBackSpare) -> list[Transition]: ...
    def unneeded(self, job: Job) -> Transition | None: ...


class JobRunner(Protocol):
    """The engine's one loop (usecases.jobs.engine.JobEngine.run), as the spares' warning path uses it."""

    def run(
        self, job_id: str, *transitions: Transition, current: Job | None = None, drive: bool = True
    ) -> tuple[Job, str]: ...


class VolumeEffects:
    """EBS mode's effects (usecases.jobs.ebs): each returns the transitions its outcome leads to."""

    def snapshot(self, job: Job, attempt: int) -> list[Transition]:
        raise RuntimeError("EBS mode without an EBS adapter")

    def cleanup(self, job: Job, cleanup: Cleanup) -> list[Transition]:
        raise RuntimeError("EBS mode without an EBS adapter")


class PoolMarks(NamedTuple):
    """What a pool event did to the pools: the (cluster, pool) pairs that kept its fact, and those of
    them whose state now is the one the event says (a launch failure: backed off now; a launch: available
    with evidence now). An event older than the pool's newer facts, or whose backoff is over, is kept as
    history only."""

    kept: tuple[tuple[str, str], ...] = ()
    in_effect: tuple[tuple[str, str], ...] = ()


class LaunchPlacement:
    """Where each launch goes: the engine's one question about capacity, and what a failed launch taught
    (usecases.jobs.advisor.PlacementAdvisor). This default places every launch as its request says."""

    def decide(self, job: Job, trigger: str) -> PlacementDecision | None:
        return None

    def launch_failed(self, job: Job, reason: str) -> None:
        pass

    def replacement(self, job: Job) -> tuple[PlacementDecision, str] | None:
        """At a warning on the host of the job's live attempt: where the next attempt is to go (the
        warned pool avoided, as the stop will avoid it) and that pool's Auto Scaling group (the early
        replacement, usecases.jobs.spares). None: no decision for this job (no pools)."""
        return None

    def provider_refused(self, job: Job, reason: str) -> None:
        """ECS refused the decision's capacity provider (`domain.jobs.run_errors.pool_refused`): mark its
        pools unavailable."""


class PoolObservations:
    """What the jobs path learns about the pools, and their discovery (usecases.jobs.advisor.
    PlacementAdvisor); JobService and Reconciler are given it. This default keeps nothing."""

    def pool_event(self, ev: PoolEvent) -> PoolMarks:
        """Record a pool event; the pools that kept it, and those it holds for now."""
        return PoolMarks()

    def still_running(self, job: Job) -> None:
        """ECS says the job's attempt runs now (reconcile's DescribeTasks): spot is still in its pool."""

    def provisioning_timed_out(self, job: Job) -> None:
        """The live attempt's pool gave it no instance in time: mark the pool unavailable."""

    def refresh(self, clusters: Sequence[str]) -> list[Refreshed]:
        """Discover the clusters' pools again (and their prices): each cluster's pools and what of its
        refresh failed (a cluster whose discovery failed: no pools, its one line)."""
        return []


# ------------------------------------------------------------------------------------ checkpoints
class Manifests(Protocol):
    def read(self, bucket: str, key: str) -> bytes: ...
    def committed(self, prefix_uri: str) -> list[tuple[int, str]]: ...


class CheckpointLedger(Protocol):
    def record_checkpoint(self, ref: CheckpointRef, count: bool = True) -> CheckpointRecorded: ...
    def newest_checkpoint(self, prefix_uri: str) -> CheckpointRef | None: ...


# ----------------------------------------------------------------------------------- bucket check
# The four settings of a bucket's public access block.
PUBLIC_ACCESS_SETTINGS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


@dataclass(frozen=True)
class BucketFacts:
    """A bucket's settings as S3 reports them (None: not set at all)."""

    versioning: str | None  # "Enabled" or "Suspended"; None when versioning was never turned on
    encryption: str | None  # the default encryption's algorithm (AES256, aws:kms, aws:kms:dsse)
    public_access_block: Mapping[str, bool] | None  # the bucket's own block, its four settings
    eventbridge: bool  # Amazon EventBridge notifications on
    unreadable: Mapping[str, str] = field(default_factory=dict)  # setting -> why it could not be read


class BucketSettings(Protocol):
    def facts(self, bucket: str) -> BucketFacts: ...


class Alerts(Protocol):
    def alert(self, subject: str, detail: Mapping[str, object]) -> None: ...


# ------------------------------------------------------------------------------------------ pools
if TYPE_CHECKING:
    from collections.abc import Collection

    from spotguard.domain.pools import (
        Discovery,
        HostPlacement,
        Observation,
        PoolRecord,
        Refreshed,
        ScoreQuote,
        SpotQuote,
    )


class PoolFinder(Protocol):
    """The cluster's pools as AWS describes them, with spot prices and placement scores
    (adapters/pools.py: PoolDiscovery)."""

    def discover(self, cluster: str, now: datetime | None = None) -> Discovery: ...
    def spot_prices(
        self, instance_types: Collection[str], zones: Collection[str], now: datetime | None = None
    ) -> list[SpotQuote]: ...
    def placement_scores(self, instance_types: Collection[str], region: str) -> dict[str, int]: ...


class PoolStore(Protocol):
    """The pools kept in the ledger (adapters/pool_store.py: DynamoPoolStore)."""

    def pools(self, cluster: str, include_gone: bool = False) -> list[PoolRecord]: ...
    def save_discovered(
        self, cluster: str, pools: Sequence[PoolRecord], now: datetime, complete: bool = True
    ) -> list[PoolRecord]: ...
    def record(self, cluster: str, pool_name: str, fact: Observation) -> PoolRecord | None: ...
    def set_prices(self, cluster: str, quotes: Sequence[SpotQuote]) -> int: ...
    def set_scores(self, cluster: str, quotes: Sequence[ScoreQuote]) -> int: ...


class HostPlacements(Protocol):
    """Where a container instance is: capacity provider, type, zone (adapters/ecs.py: EcsAdapter)."""

    def placement(self, ref: ContainerInstanceRef) -> HostPlacement | None: ...

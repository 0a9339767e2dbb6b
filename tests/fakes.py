"""In-memory fakes of every adapter port (spotguard/ports.py), for the unit tests of the use cases.

The ledger's ports, one per DynamoDB adapter:
  FakeLedger  adapters/ledger.py DynamoLedger: InterruptionLedger, StopClaims, TaskIndex and the
              checkpoints' CheckpointLedger
  FakeJobStore    adapters/job_store.py DynamoJobStore: JobStore (and `count`)
  FakePoolStore   adapters/pool_store.py DynamoPoolStore: PoolStore
ECS, SSM and EC2: FakeEcs (Ecs), FakeJobEcs (JobEcs), FakeSignaller (Signaller), FakeVolumes (Volumes),
FakeHosts (Hosts). SQS, SNS, Auto Scaling and S3: FakeFollowUps (FollowUps), FakeDeadLetters
(DeadLetters), FakeRetries (LaunchRetries), FakeNotifier (Notifications), FakeAlerts (Alerts),
FakeLifecycle (Lifecycle), FakeSpares (SpareCapacity), FakeManifests (Manifests), FakeBucketSettings
(BucketSettings).

Each keeps the adapter's contract, not a simpler one: tests/contract runs the same cases against the fake
and against the adapter on moto, so a fake that drifts from its adapter fails there. Their state is plain
attributes (dicts of models) that a unit test may set up or read directly; what a test sets is what the
adapter would hold after the same writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from spotguard.domain.checkpoints import CheckpointRecorded, CheckpointRef
from spotguard.domain.interruption.notices import (
    ContainerInstanceUpdate,
    HostClaim,
    HostRecord,
    Notice,
    NoticeInProgress,
)
from spotguard.domain.jobs.model import Job, JobState, UnreadableJob
from spotguard.domain.pools import (
    Observation,
    PoolRecord,
    ScoreQuote,
    SpotQuote,
    fold,
    mark_gone,
    merge_discovered,
    with_score,
    with_spot_price,
)
from spotguard.domain.tasks import ContainerInstanceRef, TaskInfo

# A container instance in these states is no longer one a notice can act on: the ledger answers "none".
GONE_STATUSES = ("DEREGISTERING", "INACTIVE")

# The table's CHECKPOINTS#<uri> / SEQ#<n> items: written by the ledger, read by the job store. A FakeLedger
# and a FakeJobStore given the same dict share them, as the two adapters share the table.
Checkpoints = dict[str, dict[int, CheckpointRef]]


def _ms(at: datetime) -> int:
    """A lease time as the ledger keeps it (whole milliseconds)."""
    return int(at.timestamp() * 1000)


class FakeLedger:
    """The ledger's contract in memory: the claim is one conditional write that carries the lease of the
    try holding it; a notice's record (with its outcome) is written once, after the signals. A lease runs
    out only once its time is past (`until < now`, in milliseconds); an outcome is kept as JSON."""

    def __init__(
        self, index: Iterable[ContainerInstanceRef] = (), checkpoints: Checkpoints | None = None
    ) -> None:
        self.index: dict[str, ContainerInstanceRef] = {ref.instance_id: ref for ref in index}
        self.versions: dict[str, int] = {}  # instance -> the version of the event that wrote its index
        self.notices: dict[str, dict[str, Any]] = {}  # notice key -> outcome
        self.claimed: dict[str, list[str]] = {}  # instance -> the tasks its claim names
        self.claim_cluster: dict[str, str] = {}
        self.claims: dict[str, str] = {}  # instance -> the key of the notice holding its claim
        self.leases: dict[str, tuple[str, datetime]] = {}  # claim or notice key -> (owner, until)
        self.task_index: dict[str, TaskInfo] = {}  # what task events told the ledger
        self.task_versions: dict[str, int] = {}
        self.checkpoints: Checkpoints = {} if checkpoints is None else checkpoints
        self.newest: dict[str, CheckpointRef] = {}
        self.counted: set[tuple[str, int]] = set()  # (prefix, sequence): the checkpoints counted
        self.calls: list[str] = []

    # ---------------------------------------------------------------------------------- the index
    def container_instance(self, instance_id: str) -> ContainerInstanceRef | None:
        ref = self.index.get(instance_id)
        return None if ref is None or ref.status in GONE_STATUSES else ref

    def host(self, instance_id: str, notice_key: str) -> HostRecord:
        self.calls.append("host")
        holder = self.claims.get(instance_id)
        claim = (
            HostClaim(
                notice_key=holder,
                cluster_arn=self.claim_cluster.get(instance_id, ""),
                task_arns=tuple(self.claimed.get(instance_id, [])),
            )
            if holder
            else None
        )
        return HostRecord(
            container_instance=self.container_instance(instance_id),
            claim=claim,
            outcome=self.notices.get(notice_key),
        )

    def index_container_instance(self, update: ContainerInstanceUpdate) -> bool:
        if update.instance_id in self.versions and self.versions[update.instance_id] >= update.version:
            return False
        self.versions[update.instance_id] = update.version
        self.index[update.instance_id] = ContainerInstanceRef(
            cluster_arn=update.cluster_arn,
            container_instance_arn=update.container_instance_arn,
            instance_id=update.instance_id,
            status=update.status,
        )
        return True

    def remember_container_instance(self, ref: ContainerInstanceRef) -> None:
        """What a lookup found, kept as version 0 unless anything is in already."""
        self.calls.append("remember")
        if ref.instance_id not in self.index:
            self.index[ref.instance_id] = ref
            self.versions[ref.instance_id] = 0

    # ------------------------------------------------------------------------------- the task index
    def index_task(self, info: TaskInfo, version: int, at: datetime) -> bool:
        if self.task_versions.get(info.task_arn, -1) >= version:
            return False
        self.task_versions[info.task_arn] = version
        self.task_index[info.task_arn] = info
        return True

    def indexed_tasks(self, container_instance_arn: str) -> dict[str, TaskInfo]:
        self.calls.append("indexed-tasks")
        return {
            a: t
            for a, t in self.task_index.items()
            if t.container_instance_arn == container_instance_arn and t.last_status != "STOPPED"
        }

    # ------------------------------------------------------------------------------------ notices
    def _lease(self, key: str, owner: str, now: datetime, until: datetime) -> None:
        held = self.leases.get(key)
        if held is not None and held[0] != owner and _ms(held[1]) >= _ms(now):
            raise NoticeInProgress(key)
        self.leases[key] = (owner, until)

    def lease_notice(self, notice: Notice, owner: str, now: datetime, until: datetime) -> None:
        self.calls.append("lease-notice")
        if notice.key in self.notices:
            raise NoticeInProgress(notice.key)
        self._lease(notice.key, owner, now, until)

    def claim_host(
        self,
        instance_id: str,
        notice_key: str,
        at: datetime,
        cluster_arn: str,
        task_arns: Sequence[str],
        owner: str,
        lease_until: datetime,
    ) -> tuple[str | None, list[str]]:
        self.calls.append("claim")
        holder = self.claims.get(instance_id, notice_key)
        claimed = self.claimed.get(instance_id, [])
        if holder != notice_key:
            return holder, list(claimed)
        self._lease(f"claim:{instance_id}", owner, at, lease_until)
        self.claims[instance_id] = notice_key
        self.claimed[instance_id] = claimed = list(dict.fromkeys([*claimed, *task_arns]))
        self.claim_cluster[instance_id] = cluster_arn
        return None, list(claimed)

    def claimed_tasks(self, instance_id: str) -> tuple[str, list[str]]:
        return self.claim_cluster.get(instance_id, ""), list(self.claimed.get(instance_id, []))

    def stop_claim(self, instance_id: str) -> str | None:
        return self.claims.get(instance_id)

    def finish_notice(self, notice: Notice, received: datetime, outcome: dict[str, object]) -> None:
        self.calls.append("finish")
        self.notices[notice.key] = json.loads(json.dumps(outcome, sort_keys=True, default=str))

    # -------------------------------------------------------------------------------- checkpoints
    def record_checkpoint(self, ref: CheckpointRef, count: bool = True) -> CheckpointRecorded:
        self.checkpoints.setdefault(ref.prefix_uri, {}).setdefault(ref.sequence, ref)
        newest = self.newest.get(ref.prefix_uri)
        moved = newest is None or newest.sequence < ref.sequence
        if moved:
            self.newest[ref.prefix_uri] = ref
        new = count and (ref.prefix_uri, ref.sequence) not in self.counted
        if new:
            self.counted.add((ref.prefix_uri, ref.sequence))
        return CheckpointRecorded(new=new, newest=moved)

    def newest_checkpoint(self, prefix_uri: str) -> CheckpointRef | None:
        return self.newest.get(prefix_uri)


class FakeJobStore:
    """The job store's contract in memory: create only when new, replace only on the stored `rev`, lists
    newest (or oldest) first by `updated_at`, and a job that cannot be read (`unreadable`: job id ->
    its state and time, as the index still holds them) raises on `get` and is left out of `list`.
    Every job is kept and handed out as a copy, as the adapter reads a new one from its JSON.

    `conflicts`: so many replace() calls find that another writer got there first (its rev bumped)."""

    def __init__(self, conflicts: int = 0, checkpoints: Checkpoints | None = None) -> None:
        self.jobs: dict[str, Job] = {}
        self.unreadable: dict[str, tuple[JobState, datetime]] = {}
        self.unmanaged: set[str] = set()
        self.checkpoint_refs: Checkpoints = {} if checkpoints is None else checkpoints
        self.conflicts = conflicts
        self.writes = 0
        self.group_leases: dict[str, tuple[str, datetime]] = {}  # group -> (owner, until)

    def hold_group(self, group: str, owner: str, now: datetime, until: datetime) -> bool:
        held = self.group_leases.get(group)
        if held is not None and held[1] >= now and held[0] != owner:
            return False
        self.group_leases[group] = (owner, until)
        return True

    def let_go_group(self, group: str, owner: str) -> None:
        held = self.group_leases.get(group)
        if held is not None and held[0] == owner:
            self.group_leases[group] = (owner, datetime.min.replace(tzinfo=held[1].tzinfo))

    def get(self, job_id: str) -> Job | None:
        if job_id in self.unreadable:
            raise UnreadableJob(job_id, "its document does not parse")
        job = self.jobs.get(job_id)
        return None if job is None else job.model_copy(deep=True)

    def create(self, job: Job) -> bool:
        if job.job_id in self.jobs or job.job_id in self.unreadable:
            return False
        self.jobs[job.job_id] = job.model_copy(deep=True)
        self.writes += 1
        return True

    def replace(self, job: Job, expected_rev: int) -> bool:
        current = self.jobs.get(job.job_id)
        if current is None:
            return False
        if self.conflicts:
            self.conflicts -= 1
            self.jobs[job.job_id] = current.model_copy(update={"rev": current.rev + 1})  # someone else
            return False
        if current.rev != expected_rev:
            return False
        self.jobs[job.job_id] = job.model_copy(deep=True)
        self.writes += 1
        return True

    def list(
        self,
        state: JobState | None,
        limit: int,
        on_unreadable: Callable[[UnreadableJob], None] | None = None,
        oldest_first: bool = False,
    ) -> list[Job]:
        """As the adapter: per state, the first `limit` items of the index (an unreadable one takes its
        place among them, and is reported), then the newest (or oldest) `limit` of them all."""
        jobs: list[Job] = []
        for s in [state] if state else list(JobState):
            items: list[tuple[datetime, str, Job | None]] = [
                (j.updated_at, j.job_id, j) for j in self.jobs.values() if j.state is s
            ]
            items += [(at, job_id, None) for job_id, (st, at) in self.unreadable.items() if st is s]
            items.sort(key=lambda i: i[0], reverse=not oldest_first)
            for _at, job_id, job in items[:limit]:
                if job is not None:
                    jobs.append(job.model_copy(deep=True))
                elif on_unreadable is not None:
                    on_unreadable(UnreadableJob(job_id, "its document does not parse"))
        jobs.sort(key=lambda j: j.updated_at, reverse=not oldest_first)
        return jobs[:limit]

    def count(self, state: JobState) -> int:
        return sum(j.state is state for j in self.jobs.values()) + sum(
            st is state for st, _ in self.unreadable.values()
        )

    def known_unmanaged(self, task_arn: str) -> bool:
        return task_arn in self.unmanaged

    def remember_unmanaged(self, task_arn: str, at: datetime) -> None:
        self.unmanaged.add(task_arn)

    def checkpoints(self, prefix_uri: str) -> list[CheckpointRef]:
        refs = self.checkpoint_refs.get(prefix_uri, {})
        return [refs[seq] for seq in sorted(refs)]


class FakePoolStore:
    """The pool store's contract in memory: a cluster's pools by name; discovery merges what it finds
    (merge_discovered) and, when complete, marks gone what it did not find (kept with its facts); facts,
    prices and scores fold into a pool (None for a pool not stored). `unreadable`: (cluster, name) of
    items that cannot be read: left out, and overwritten by the next discovery that finds them.
    `calls`: "query" for each `pools`, "record <name>" for each `record`."""

    def __init__(self, *pools: PoolRecord) -> None:
        self.stored: dict[tuple[str, str], PoolRecord] = {(p.cluster, p.name): p for p in pools}
        self.unreadable: set[tuple[str, str]] = set()
        self.calls: list[str] = []

    @property
    def by_name(self) -> dict[str, PoolRecord]:
        """Every pool stored, gone ones too, by name (the tests use one cluster)."""
        return {name: p for (_, name), p in sorted(self.stored.items())}

    def _all(self, cluster: str) -> list[PoolRecord]:
        return [p for (c, _), p in sorted(self.stored.items()) if c == cluster]

    def pools(self, cluster: str, include_gone: bool = False) -> list[PoolRecord]:
        self.calls.append("query")
        return [p for p in self._all(cluster) if include_gone or p.gone_since is None]

    def _apply(
        self, cluster: str, name: str, change: Callable[[PoolRecord | None], PoolRecord | None]
    ) -> PoolRecord | None:
        after = change(self.stored.get((cluster, name)))
        if after is not None:
            self.stored[(cluster, name)] = after
            self.unreadable.discard((cluster, name))
        return after

    def save_discovered(
        self, cluster: str, pools: Sequence[PoolRecord], now: datetime, complete: bool = True
    ) -> list[PoolRecord]:
        found = {p.name: p for p in pools if p.cluster == cluster}
        result = [
            self._apply(cluster, name, lambda current, p=p: merge_discovered(current, p))
            for name, p in found.items()
        ]
        if complete:
            for old in self._all(cluster):
                if old.name not in found and old.gone_since is None:
                    self.stored[(cluster, old.name)] = mark_gone(old, now)
        return sorted((p for p in result if p is not None and p.gone_since is None), key=lambda p: p.name)

    def record(self, cluster: str, pool_name: str, fact: Observation) -> PoolRecord | None:
        self.calls.append(f"record {pool_name}")
        return self._apply(cluster, pool_name, lambda current: current and fold(current, fact))

    def _apply_to_all(self, cluster: str, change: Callable[[PoolRecord], PoolRecord]) -> int:
        changed = 0
        for pool in self._all(cluster):
            after = change(pool)
            self.stored[(cluster, pool.name)] = after
            changed += after != pool
        return changed

    def set_prices(self, cluster: str, quotes: Sequence[SpotQuote]) -> int:
        return self._apply_to_all(cluster, lambda pool: _each(pool, quotes, with_spot_price))

    def set_scores(self, cluster: str, quotes: Sequence[ScoreQuote]) -> int:
        return self._apply_to_all(cluster, lambda pool: _each(pool, quotes, with_score))


def _each(
    pool: PoolRecord, quotes: Sequence[Any], apply: Callable[[PoolRecord, Any], PoolRecord]
) -> PoolRecord:
    for quote in quotes:
        pool = apply(pool, quote)
    return pool


# ------------------------------------------------------------------- ECS, SSM and EC2 ports' fakes
# (the interruption path's Ecs, the jobs path's JobEcs, Hosts, Signaller, Volumes; tests/contract holds
# each to its adapter on moto)
#
#   FakeEcs        adapters/ecs.py EcsAdapter: Ecs
#   FakeSignaller  adapters/ssm.py SsmSignaller: Signaller
#   FakeVolumes    adapters/ebs.py EbsAdapter: Volumes
#   FakeHosts      adapters/hosts.py Ec2Hosts: Hosts
#   FakeJobEcs     adapters/job_ecs.py JobEcsAdapter: JobEcs
import itertools  # noqa: E402

from spotguard.adapters.ssm import MAX_PER_PARAMETER, signal_document_parameters  # noqa: E402
from spotguard.domain.jobs.replies import HostInfo, RunResult, TaskDefinitionInfo  # noqa: E402
from spotguard.domain.jobs.task_events import described_task  # noqa: E402
from spotguard.domain.prices import gpus_of, on_demand_price  # noqa: E402
from spotguard.domain.tasks import TaskEvent, gpu_count  # noqa: E402

AWS_ACCOUNT = "123456789012"
AWS_REGION = "us-east-1"


def aws_error(code: str, message: str, operation: str) -> Exception:
    """The error boto3 raises for an AWS error answer (botocore's ClientError)."""
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def names_cluster(cluster_arn: str, cluster: str) -> bool:
    """ECS takes a cluster by its name or by its ARN."""
    return cluster in (cluster_arn, cluster_arn.rsplit("/", 1)[-1])


class FakeEcs:
    """The interruption path's ECS (adapters/ecs.py EcsAdapter, the Ecs port) in memory.

    `hosts`: the container instances by EC2 instance id; `tasks`: each task as DescribeTasks shows it to
    the adapter; `definitions`: whether each task definition (by ARN) asks for a GPU, a definition not
    there is one ECS does not know (an error, as the adapter's). A stop asks (desired STOPPED, as in ECS);
    the task has stopped once it is in `stopped_arns` (ECS stops it later), and a task ECS does not know
    counts as stopped. `calls` names each call; `fail_stop`: tasks whose next StopTask fails; `reasons`:
    the stops' reasons."""

    def __init__(
        self,
        tasks: Iterable[TaskInfo] = (),
        hosts: Iterable[ContainerInstanceRef] = (),
        definitions: dict[str, bool] | None = None,
    ) -> None:
        self.tasks: dict[str, TaskInfo] = {t.task_arn: t for t in tasks}
        self.hosts: dict[str, ContainerInstanceRef] = {h.instance_id: h for h in hosts}
        self.definitions: dict[str, bool] = dict(definitions or {})
        self.calls: list[str] = []
        self.fail_stop: set[str] = set()
        self.stopped_arns: set[str] = set()
        self.reasons: list[str] = []

    def find_container_instance(
        self, instance_id: str, clusters: Sequence[str]
    ) -> ContainerInstanceRef | None:
        """The host in one of `clusters` (names or ARNs; none named: every cluster)."""
        self.calls.append("find")
        ref = self.hosts.get(instance_id)
        if ref is None or (clusters and not any(names_cluster(ref.cluster_arn, c) for c in clusters)):
            return None
        return ref

    def drain(self, ref: ContainerInstanceRef) -> None:
        """DRAINING; a host ECS no longer knows has nothing left to drain."""
        self.calls.append("drain")
        host = self.hosts.get(ref.instance_id)
        if host is not None and host.container_instance_arn == ref.container_instance_arn:
            self.hosts[ref.instance_id] = host.model_copy(update={"status": "DRAINING"})

    def running_task_arns(self, ref: ContainerInstanceRef) -> list[str]:
        self.calls.append("list")
        return [
            arn
            for arn, t in self.tasks.items()
            if t.container_instance_arn == ref.container_instance_arn and t.desired_status == "RUNNING"
        ]

    def describe_tasks(self, cluster_arn: str, arns: Sequence[str]) -> list[TaskInfo]:
        """The tasks of the cluster ECS knows, the others left out."""
        self.calls.append("describe-tasks")
        return [
            self.tasks[a]
            for a in arns
            if a in self.tasks and names_cluster(self.tasks[a].cluster_arn, cluster_arn)
        ]

    def stopped(self, cluster_arn: str, task_arns: Sequence[str]) -> list[str]:
        self.calls.append("describe")
        return [a for a in task_arns if a in self.stopped_arns or a not in self.tasks]

    def definition_has_gpu(self, task_definition_arn: str) -> bool:
        self.calls.append("definition")
        if task_definition_arn not in self.definitions:
            raise aws_error(
                "ClientException", "Unable to describe task definition.", "DescribeTaskDefinition"
            )
        return self.definitions[task_definition_arn]

    def stop_task(self, cluster: str, task_arn: str, reason: str) -> None:
        """Desired STOPPED; a task ECS no longer knows is stopped already, which is what was asked."""
        self.calls.append("stop")
        if task_arn in self.fail_stop:
            self.fail_stop.discard(task_arn)
            raise RuntimeError("throttled")
        if task_arn in self.tasks:
            self.tasks[task_arn] = self.tasks[task_arn].model_copy(update={"desired_status": "STOPPED"})
        self.reasons.append(reason)


class FakeSignaller:
    """SSM Run Command through SpotGuard's signal document (adapters/ssm.py SsmSignaller, the Signaller
    port) in memory: each call is checked and split as the adapter does (`signal_document_parameters`, 50
    tasks a command, a bad one refused before its command), and each command SSM would get is kept in
    `commands` as (command id, instance id, the document's parameters); the ids, comma-separated, are the
    answer. `sent` keeps each call (instance, tasks, signal); `log`, when given, gets ("signal", instance,
    task ARNs, signal) for each call, beside other fakes' entries in the same list."""

    def __init__(self, log: list[Any] | None = None) -> None:
        self.commands: list[tuple[str, str, dict[str, list[str]]]] = []
        self.sent: list[tuple[str, tuple[TaskInfo, ...], str]] = []
        self.log = log
        self._ids = itertools.count(1)

    def signal(self, instance_id: str, tasks: Sequence[TaskInfo], signal: str) -> str:
        self.sent.append((instance_id, tuple(tasks), signal))
        if self.log is not None:
            self.log.append(("signal", instance_id, tuple(t.task_arn for t in tasks), signal))
        ids = []
        for i in range(0, len(tasks), MAX_PER_PARAMETER):
            parameters = signal_document_parameters(tasks[i : i + MAX_PER_PARAMETER], signal)
            command_id = f"{next(self._ids):08x}-5ca1-4e00-8000-000000000000"
            self.commands.append((command_id, instance_id, parameters))
            ids.append(command_id)
        return ",".join(ids)


class FakeVolumes:
    """EBS for EBS mode (adapters/ebs.py EbsAdapter, the Volumes port) in memory: volumes and snapshots
    found by their owner (job id, attempt), as the adapter finds them by SpotGuard's tags, so a second
    snapshot of an attempt is the first one (unless that one failed: state "error").

    `add_volume` stands for the volume ECS makes at a launch (attached: in use by its task, not deleted
    until it is let go); a new snapshot takes the state `snapshot_state` (AWS: pending, then completed).
    `snapshots`: the volumes snapshotted, in order. Ids count up: vol-0001, snap-00000001, ..."""

    def __init__(self, snapshot_state: str = "completed") -> None:
        self.state = snapshot_state
        self.volumes: dict[str, tuple[str, int] | None] = {}  # volume id -> owner
        self.attached: set[str] = set()
        self.taken: dict[str, tuple[tuple[str, int] | None, str]] = {}  # snapshot id -> (owner, state)
        self.snapshots: list[str] = []
        self._volume_ids = itertools.count(1)
        self._snapshot_ids = itertools.count(1)

    def add_volume(self, job_id: str | None, attempt: int = 0, attached: bool = False) -> str:
        """A volume of (job, attempt); job None: a volume that is not SpotGuard's."""
        volume_id = f"vol-{next(self._volume_ids):04d}"
        self.volumes[volume_id] = None if job_id is None else (job_id, attempt)
        if attached:
            self.attached.add(volume_id)
        return volume_id

    def find(self, job_id: str, attempt: int) -> str | None:
        return next((v for v, owner in self.volumes.items() if owner == (job_id, attempt)), None)

    def snapshot(self, volume_id: str, job_id: str, attempt: int) -> str:
        owner = (job_id, attempt)
        taken = next((s for s, (o, state) in self.taken.items() if o == owner and state != "error"), None)
        if taken is not None:
            return taken
        if volume_id not in self.volumes:
            raise aws_error(
                "InvalidVolume.NotFound", f"The volume '{volume_id}' does not exist.", "CreateSnapshot"
            )
        snapshot_id = f"snap-{next(self._snapshot_ids):08d}"
        self.taken[snapshot_id] = (owner, self.state)
        self.snapshots.append(volume_id)
        return snapshot_id

    def snapshot_state(self, snapshot_id: str) -> str | None:
        taken = self.taken.get(snapshot_id)
        return taken[1] if taken else None

    def snapshot_owner(self, snapshot_id: str) -> tuple[str, int] | None:
        taken = self.taken.get(snapshot_id)
        return taken[0] if taken else None

    def delete_volume(self, volume_id: str) -> bool:
        if volume_id in self.attached:
            return False
        self.volumes.pop(volume_id, None)
        return True

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.taken.pop(snapshot_id, None)


class FakeHosts:
    """What a task runs on (adapters/hosts.py Ec2Hosts, the Hosts port) in memory: `add` registers an
    EC2 instance as a container instance; its facts are what the adapter makes of EC2's: the spot price
    of its type in its zone (`spot_prices`) for a spot instance, the on-demand price (domain.prices) for
    another, its GPUs by type (domain.prices, else `instance_gpus`: what EC2's instance types say). A
    container instance ECS does not know: None."""

    def __init__(
        self,
        spot_prices: dict[tuple[str, str], float] | None = None,
        instance_gpus: dict[str, int] | None = None,
    ) -> None:
        self.spot_prices: dict[tuple[str, str], float] = dict(spot_prices or {})
        self.instance_gpus: dict[str, int] = dict(instance_gpus or {})
        self.instances: dict[str, dict[str, Any]] = {}  # instance id -> EC2's facts
        self.container_instances: dict[str, tuple[str, str]] = {}  # container instance ARN -> (cluster, id)
        self._ids = itertools.count(1)

    def add(
        self,
        cluster: str,
        instance_type: str = "g5.xlarge",
        availability_zone: str = "us-east-1a",
        spot: bool = True,
    ) -> tuple[str, str]:
        """A running instance registered in `cluster`: (its container instance ARN, its instance id)."""
        n = next(self._ids)
        instance_id = f"i-{n:017x}"
        name = cluster.rsplit("/", 1)[-1]
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:container-instance/{name}/{n:032x}"
        self.instances[instance_id] = {
            "type": instance_type,
            "zone": availability_zone,
            "spot": spot,
            "private_ip": f"10.0.{n // 256}.{n % 256}",
        }
        self.container_instances[arn] = (name, instance_id)
        return arn, instance_id

    def facts(self, cluster: str, container_instance_arn: str) -> HostInfo | None:
        found = self.container_instances.get(container_instance_arn)
        if found is None or cluster.rsplit("/", 1)[-1] != found[0]:
            return None
        instance_id = found[1]
        inst = self.instances[instance_id]
        itype, zone = inst["type"], inst["zone"]
        price = self.spot_prices.get((itype, zone)) if inst["spot"] else on_demand_price(itype)
        gpus = gpus_of(itype)
        return HostInfo(
            instance_id=instance_id,
            instance_type=itype,
            availability_zone=zone,
            lifecycle="spot" if inst["spot"] else "on-demand",
            instance_price=price,
            instance_gpus=gpus if gpus is not None else self.instance_gpus.get(itype) or None,
            private_ip=inst["private_ip"],
        )


_ECS_MODEL: list[Any] = []  # botocore's model of ECS, loaded once (no client, no call)


def run_task_report(params: dict[str, Any]) -> str | None:
    """What botocore's validator (the one every boto3 call goes through) says of RunTask parameters,
    one line per fault; None when it says nothing."""
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    if not _ECS_MODEL:
        _ECS_MODEL.append(get_session().get_service_model("ecs").operation_model("RunTask").input_shape)
    report = ParamValidator().validate(params, _ECS_MODEL[0])
    return report.generate_report() if report.has_errors() else None


class FakeJobEcs:
    """The jobs path's ECS (adapters/job_ecs.py JobEcsAdapter, the JobEcs port) in memory: RunTask,
    task descriptions (TaskEvents, read from descriptions by the adapter's own `described_task`), task
    definitions and the clusters' container instances.

    `results`: scripted answers RunTask gives first, in order (a unit test's script; a task a result
    names is described from then on). Without them it answers as ECS would: a request botocore's model
    refuses, an unknown cluster or task definition are request failures; a cluster with no ACTIVE
    container instance places nothing (capacity); else the task starts on the first ACTIVE one, and a
    client token used before answers the task it started. A stop asks (desired STOPPED, with its reason);
    `finish` is ECS stopping it. `runs`: every RunTask's parameters; `stops`: (task ARN, reason)."""

    def __init__(self, *results: RunResult) -> None:
        self.results = list(results)
        self.runs: list[dict[str, Any]] = []
        self.stops: list[tuple[str, str]] = []
        self.clusters: dict[str, str] = {}  # name -> ARN
        self.hosts: dict[str, dict[str, Any]] = {}  # container instance ARN -> cluster, status, type, GPUs
        self.definitions: dict[str, dict[str, Any]] = {}  # ARN -> as DescribeTaskDefinition shows it
        self.tasks: dict[str, dict[str, Any]] = {}  # ARN -> as DescribeTasks shows it
        self.tokens: dict[str, str] = {}  # client token -> the task it started
        self._ids = itertools.count(1)

    # --------------------------------------------------------------------------- the world in it
    def add_cluster(self, name: str) -> str:
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:cluster/{name}"
        self.clusters[name] = arn
        return arn

    def add_host(self, cluster: str, instance_type: str = "g5.xlarge", registered_gpus: int = 0) -> str:
        """A container instance of `cluster` (ACTIVE): its ARN. `registered_gpus`: the GPU resource its
        agent registered (0: none, its type says)."""
        name = cluster.rsplit("/", 1)[-1]
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:container-instance/{name}/{next(self._ids):032x}"
        self.hosts[arn] = {
            "cluster": name,
            "status": "ACTIVE",
            "type": instance_type,
            "gpus": registered_gpus,
        }
        return arn

    def register(self, **definition: Any) -> str:
        """RegisterTaskDefinition: the new revision's ARN."""
        family = definition["family"]
        revision = 1 + sum(d["family"] == family for d in self.definitions.values())
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task-definition/{family}:{revision}"
        self.definitions[arn] = {**definition, "taskDefinitionArn": arn, "revision": revision}
        return arn

    def finish(self, task_arn: str) -> None:
        """ECS has stopped the task."""
        self.tasks[task_arn] = {**self.tasks[task_arn], "lastStatus": "STOPPED", "desiredStatus": "STOPPED"}

    def _cluster_arn(self, cluster: str) -> str | None:
        name = cluster.rsplit("/", 1)[-1]
        return self.clusters.get(name) if cluster in (name, self.clusters.get(name)) else None

    def _definition(self, ref: str) -> dict[str, Any] | None:
        """By ARN, family:revision or family (its latest revision)."""
        for arn, d in reversed(self.definitions.items()):
            if ref in (arn, f"{d['family']}:{d['revision']}", d["family"]):
                return d
        return None

    def _describe(self, arn: str, params: dict[str, Any], cluster_arn: str, host: str | None) -> None:
        definition = self._definition(str(params.get("taskDefinition", ""))) or {}
        containers = definition.get("containerDefinitions") or []
        self.tasks[arn] = {
            "taskArn": arn,
            "clusterArn": cluster_arn,
            "taskDefinitionArn": definition.get("taskDefinitionArn", params.get("taskDefinition", "")),
            "containerInstanceArn": host,
            "lastStatus": "PROVISIONING",
            "desiredStatus": "RUNNING",
            "startedBy": params.get("startedBy", ""),
            "group": params.get("group") or f"family:{definition.get('family', '')}",
            "launchType": params.get("launchType"),
            "overrides": params.get("overrides") or {},
            "tags": list(params.get("tags") or []),
            "containers": [{"name": c["name"], "lastStatus": "PENDING"} for c in containers],
        }

    # --------------------------------------------------------------------------------- the port
    def check_run_task(self, params: dict[str, Any]) -> str | None:
        report = run_task_report(params)
        if report is None:
            return None
        line = report.splitlines()[0].strip()
        return line if len(line) <= 300 else line[:297] + "..."

    def run_task(self, params: dict[str, Any]) -> RunResult:
        self.runs.append(params)
        if self.results:
            result = self.results.pop(0)
            if result.task_arn and result.task_arn not in self.tasks:
                self._describe(result.task_arn, params, str(params.get("cluster", "")), None)
            return result
        report = run_task_report(params)
        if report is not None:
            return RunResult(failure="request", reason=report.splitlines()[-1][:500])
        token = params.get("clientToken")
        if token in self.tokens:
            return RunResult(task_arn=self.tokens[token])
        cluster_arn = self._cluster_arn(str(params.get("cluster", "default")))
        if cluster_arn is None:
            return RunResult(failure="request", reason="ClusterNotFoundException: Cluster not found.")
        if self._definition(str(params["taskDefinition"])) is None:
            return RunResult(failure="request", reason="ClientException: Unable to describe task definition.")
        name = cluster_arn.rsplit("/", 1)[-1]
        host = next(
            (a for a, h in self.hosts.items() if h["cluster"] == name and h["status"] == "ACTIVE"), None
        )
        if host is None:
            return RunResult(failure="capacity", reason="no task was placed")
        arn = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task/{name}/{next(self._ids):032x}"
        self._describe(arn, params, cluster_arn, host)
        if token:
            self.tokens[token] = arn
        return RunResult(task_arn=arn)

    def stop_task(self, cluster: str, task_arn: str, reason: str) -> None:
        """Desired STOPPED, with the reason; a task ECS does not know is stopped already."""
        self.stops.append((task_arn, reason))
        if task_arn in self.tasks:
            self.tasks[task_arn] = {
                **self.tasks[task_arn],
                "desiredStatus": "STOPPED",
                "stoppedReason": reason,
            }

    def _in(self, cluster: str, task_arn: str) -> dict[str, Any] | None:
        task = self.tasks.get(task_arn)
        return task if task is not None and names_cluster(task["clusterArn"], cluster) else None

    def describe_task(self, cluster: str, task_arn: str) -> TaskEvent | None:
        task = self._in(cluster, task_arn)
        return described_task(task) if task is not None else None

    def describe_many(self, cluster: str, task_arns: Sequence[str]) -> tuple[dict[str, TaskEvent], list[str]]:
        found = {a: described_task(t) for a in task_arns if (t := self._in(cluster, a)) is not None}
        return found, [a for a in task_arns if a not in found]

    def task_definition(self, arn: str, overrides: dict[str, Any] | None = None) -> TaskDefinitionInfo:
        td = self._definition(arn)
        if td is None:
            raise aws_error(
                "ClientException", "Unable to describe task definition.", "DescribeTaskDefinition"
            )
        containers = td.get("containerDefinitions") or []
        return TaskDefinitionInfo(
            arn=td["taskDefinitionArn"],
            family=td["family"],
            task_role_arn=td.get("taskRoleArn"),
            execution_role_arn=td.get("executionRoleArn"),
            network_mode=td.get("networkMode"),
            containers=[c["name"] for c in containers],
            gpus=gpu_count(td, overrides),
            volumes_at_launch=[v["name"] for v in td.get("volumes") or [] if v.get("configuredAtLaunch")],
            mounts={
                c["name"]: {m["sourceVolume"]: m["containerPath"] for m in c.get("mountPoints") or []}
                for c in containers
            },
            environment={
                c["name"]: {e["name"]: e.get("value", "") for e in c.get("environment") or []}
                for c in containers
            },
        )

    def largest_gpus(self, cluster: str) -> int | None:
        """The most GPUs of an ACTIVE container instance of the cluster: registered, or by its type."""
        name = cluster.rsplit("/", 1)[-1]
        gpus = [
            max(h["gpus"], gpus_of(h["type"]) or 0)
            for h in self.hosts.values()
            if h["cluster"] == name and h["status"] == "ACTIVE"
        ]
        return max(gpus) if gpus else None


# ----------------------------------------------------------- end of ECS, SSM and EC2 ports' fakes


# -------------------------------------------------- SQS, SNS, Auto Scaling and S3 ports' fakes
# (FollowUps, DeadLetters, LaunchRetries, Notifications, Alerts, Lifecycle, SpareCapacity, Manifests,
# BucketSettings; tests/contract holds each to its adapter on moto)
#
#   FakeFollowUps       adapters/queues.py FollowUpQueue: FollowUps
#   FakeDeadLetters     adapters/queues.py DeadLetters: DeadLetters
#   FakeRetries         adapters/queues.py RetryQueue: LaunchRetries
#   FakeNotifier        adapters/notify.py Notifier: Notifications
#   FakeAlerts          adapters/notify.py TopicAlerts: Alerts
#   FakeLifecycle       adapters/autoscaling.py LifecycleAdapter: Lifecycle
#   FakeSpares          adapters/autoscaling.py AsgSpares: SpareCapacity
#   FakeManifests       adapters/s3.py S3Checkpoints: Manifests
#   FakeBucketSettings  adapters/bucket.py S3BucketSettings: BucketSettings
from collections.abc import Mapping  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import NamedTuple  # noqa: E402

from botocore.exceptions import ClientError  # noqa: E402

from spotguard.adapters.autoscaling import BUSY  # noqa: E402
from spotguard.adapters.notify import EMAILED  # noqa: E402
from spotguard.adapters.queues import MAX_DELAY_SECONDS  # noqa: E402
from spotguard.adapters.s3 import split_uri  # noqa: E402
from spotguard.domain.checkpoints import MANIFEST, ManifestUnreadable, manifest_location  # noqa: E402
from spotguard.domain.interruption.notices import LifecycleRef  # noqa: E402
from spotguard.domain.jobs.replies import Notification  # noqa: E402
from spotguard.ports import BucketFacts  # noqa: E402

# The calls of several fakes in one list, in the order they were made (a notice's signal, heartbeat and
# follow-up, across three ports).
CallLog = list[tuple[Any, ...]]


def sqs_delay(delay_seconds: int) -> int:
    """The delay a queue adapter's message gets: the one asked, within none and SQS's 15 minutes."""
    return max(0, min(delay_seconds, MAX_DELAY_SECONDS))


def _due(delays: Sequence[int], delivered: set[int], after_seconds: float) -> list[int]:
    """Which delayed messages a queue delivers once `after_seconds` have passed since they were sent:
    those whose delay has passed, each once (the indexes of `delays`, marked in `delivered`)."""
    due = [i for i, d in enumerate(delays) if i not in delivered and sqs_delay(d) <= after_seconds]
    delivered.update(due)
    return due


class FollowUp(NamedTuple):
    """One Lifecycle Check asked of FollowUps."""

    instance_id: str
    ref: LifecycleRef
    deadline: datetime
    notice_key: str
    delay_seconds: int  # as asked (the queue caps it: `sqs_delay`)


class FakeFollowUps:
    """The Lifecycle Checks asked, in order, in `sent`; `due` hands each back once its delay has passed,
    as the interruption queue delivers it. `calls`, a log other fakes may share, gets ("check", instance
    id, deadline, notice key, delay) for each."""

    def __init__(self, calls: CallLog | None = None) -> None:
        self.calls: CallLog = calls if calls is not None else []
        self.sent: list[FollowUp] = []
        self._delivered: set[int] = set()

    def lifecycle_check(
        self, instance_id: str, ref: LifecycleRef, deadline: datetime, notice_key: str, delay_seconds: int
    ) -> None:
        self.sent.append(FollowUp(instance_id, ref, deadline, notice_key, delay_seconds))
        self.calls.append(("check", instance_id, deadline, notice_key, delay_seconds))

    def due(self, after_seconds: float) -> list[FollowUp]:
        """The checks the queue delivers once `after_seconds` have passed since they were asked."""
        delays = [f.delay_seconds for f in self.sent]
        return [self.sent[i] for i in _due(delays, self._delivered, after_seconds)]


class DeadLetter(NamedTuple):
    """One rejected record as the dead-letter queue holds it."""

    body: str
    reason: str
    source_message_id: str


class FakeDeadLetters:
    """Each rejected record as the dead-letter queue holds it, in order, in `sent`: SQS takes no empty
    body nor attribute, so an empty body is "(empty)" and an empty reason or source id "-"; a reason is
    cut at 1000 characters."""

    def __init__(self) -> None:
        self.sent: list[DeadLetter] = []

    def send(self, body: str, reason: str, source_message_id: str) -> None:
        self.sent.append(DeadLetter(body or "(empty)", reason[:1000] or "-", source_message_id or "-"))


class FakeRetries:
    """Each Launch Due asked, (job id, launch try, delay), in order, in `scheduled`; `due` hands each back
    once its delay has passed, as the retry queue delivers it."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[str, int, int]] = []
        self._delivered: set[int] = set()

    def schedule(self, job_id: str, launch_try: int, delay_seconds: int) -> None:
        self.scheduled.append((job_id, launch_try, delay_seconds))

    def due(self, after_seconds: float) -> list[tuple[str, int]]:
        """(job id, launch try) of each Launch Due the queue delivers once `after_seconds` have passed
        since it was scheduled."""
        delays = [d for _, _, d in self.scheduled]
        return [self.scheduled[i][:2] for i in _due(delays, self._delivered, after_seconds)]


class FakeNotifier:
    """Every notification sent, in order, in `sent`: each an event on the bus; `emailed`, those of a kind
    worth an e-mail (adapters.notify.EMAILED), which go to the topic as well."""

    def __init__(self) -> None:
        self.sent: list[Notification] = []

    def send_all(self, notifications: list[Notification]) -> None:
        self.sent += notifications

    @property
    def emailed(self) -> list[Notification]:
        return [n for n in self.sent if n.kind in EMAILED]


class FakeAlerts:
    """Each alert as the topic gets it, (subject, detail), in `sent` (SNS takes a subject of at most 100
    characters: a longer one is cut). `fail`: the topic cannot be reached, and each alert raises."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, Mapping[str, object]]] = []
        self.fail = fail

    def alert(self, subject: str, detail: Mapping[str, object]) -> None:
        if self.fail:
            raise RuntimeError("SNS is down")
        self.sent.append((subject[:100], detail))


class FakeLifecycle:
    """Each heartbeat and completion that reached its lifecycle action, (what, ref, instance id), in
    order, in `answered`; `calls`, a log other fakes may share, gets ("heartbeat" | "complete", instance
    id) for every call. An action completed already leaves nothing to heartbeat or complete, which is no
    error (AWS's "No active Lifecycle Action", which the adapter takes as done); each of `failures` is
    raised by the next call in turn: the other errors, which the adapter raises."""

    def __init__(self, calls: CallLog | None = None) -> None:
        self.calls: CallLog = calls if calls is not None else []
        self.answered: list[tuple[str, LifecycleRef, str]] = []
        self.failures: list[Exception] = []
        self._completed: set[tuple[LifecycleRef, str]] = set()

    def heartbeat(self, ref: LifecycleRef, instance_id: str) -> None:
        self._answer("heartbeat", ref, instance_id)

    def complete(self, ref: LifecycleRef, instance_id: str) -> None:
        self._answer("complete", ref, instance_id)

    def _answer(self, what: str, ref: LifecycleRef, instance_id: str) -> None:
        self.calls.append((what, instance_id))
        if self.failures:
            raise self.failures.pop(0)
        if (ref, instance_id) in self._completed:
            return  # gone: nothing left to answer
        self.answered.append((what, ref, instance_id))
        if what == "complete":
            self._completed.add((ref, instance_id))


@dataclass
class FakeGroup:
    """One Auto Scaling group: its desired capacity, its maximum size and its instances (id -> lifecycle
    state, as the group lists them)."""

    desired: int
    max_size: int
    instances: dict[str, str] = field(default_factory=dict)


class FakeSpares:
    """Auto Scaling groups and the clusters their instances join, in memory: `groups` by name, and
    `registered`, per cluster, each EC2 instance registered as a container instance with its running and
    pending tasks. A raise sets the group's desired capacity one higher (the instance that brings is the
    test's to add, as the group launches it when it will); a give-back drains (`draining`: (cluster,
    instance id)) and terminates one idle instance the group added since the spare was asked for,
    lowering the desired capacity. The adapter's answers, word for word."""

    def __init__(self) -> None:
        self.groups: dict[str, FakeGroup] = {}
        self.registered: dict[str, dict[str, int]] = {}
        self.draining: set[tuple[str, str]] = set()

    def raise_one(self, group: str) -> tuple[bool, tuple[str, ...], str]:
        g = self.groups.get(group)
        if g is None:
            return False, (), f"Auto Scaling group {group} not found"
        before = tuple(g.instances)
        if g.desired >= g.max_size:
            return False, before, f"{group} is at its maximum size ({g.max_size}): no spare asked"
        g.desired += 1
        return True, before, f"{group}: desired capacity {g.desired - 1} -> {g.desired}"

    def give_back(
        self, cluster: str, group: str, before: tuple[str, ...], keep: int
    ) -> tuple[str | None, str, bool]:
        g = self.groups.get(group)
        if g is None:
            return None, f"Auto Scaling group {group} not found: nothing to give back", True
        new = [i for i, state in g.instances.items() if i not in before and state in BUSY]
        if not new:
            return None, f"{group} has listed no instance added since the spare was asked for", False
        registered = self.registered.get(cluster, {})
        idle = [i for i in new if registered.get(i, 0) == 0]
        if len(idle) <= keep:
            busy = len(new) - len(idle)
            said = f"{group}: {busy} new instance(s) run tasks, {len(idle)} kept for other spares"
            return None, said, not idle
        ready = sorted(i for i in idle if i in registered)
        if not ready:
            return None, f"{group}: the instance added is still booting: given back once it has joined", False
        instance = ready[0]
        self.draining.add((cluster, instance))
        del g.instances[instance]
        g.desired -= 1
        return instance, f"{group}: terminated {instance}, which ran no task", True


class FakeManifests:
    """Checkpoint buckets in memory: `buckets`, each bucket's objects by key. A manifest missing from
    its bucket is gone; one in a bucket not there cannot be read (S3's NoSuchBucket), never by retrying;
    listing a bucket not there raises S3's error."""

    def __init__(self, buckets: Mapping[str, Mapping[str, bytes]] | None = None) -> None:
        self.buckets: dict[str, dict[str, bytes]] = {b: dict(o) for b, o in (buckets or {}).items()}

    def read(self, bucket: str, key: str) -> bytes:
        where = f"s3://{bucket}/{key}"
        objects = self.buckets.get(bucket)
        if objects is None:
            raise ManifestUnreadable(f"{where}: cannot be read (NoSuchBucket)", gone=False)
        if key not in objects:
            raise ManifestUnreadable(f"{where}: no such manifest (NoSuchKey)", gone=True)
        return objects[key]

    def committed(self, prefix_uri: str) -> list[tuple[int, str]]:
        bucket, prefix = split_uri(prefix_uri)
        objects = self.buckets.get(bucket)
        if objects is None:
            error = {"Code": "NoSuchBucket", "Message": "The specified bucket does not exist"}
            raise ClientError({"Error": error}, "ListObjectsV2")
        found: list[tuple[int, str]] = []
        for key in objects:
            if key.startswith(f"{prefix}checkpoints/") and key.endswith(f"/{MANIFEST}"):
                where = manifest_location(bucket, key)
                if where is not None and where[0] == prefix_uri:
                    found.append((where[1], key))
        return sorted(found, reverse=True)


# What S3BucketSettings reads of a bucket, each setting by the name `BucketFacts.unreadable` gives it.
BUCKET_SETTINGS = ("versioning", "encryption", "public_access_block", "eventbridge")


class FakeBucketSettings:
    """Buckets' settings: `buckets`, each bucket's facts as S3 reports them; a bucket not there has every
    setting unreadable (NoSuchBucket), as S3 answers. `failure`, when set, is raised by every read (S3
    out of reach); `reads` counts the reads."""

    def __init__(
        self, buckets: Mapping[str, BucketFacts] | None = None, failure: Exception | None = None
    ) -> None:
        self.buckets: dict[str, BucketFacts] = dict(buckets or {})
        self.failure = failure
        self.reads = 0

    def facts(self, bucket: str) -> BucketFacts:
        self.reads += 1
        if self.failure is not None:
            raise self.failure
        if bucket in self.buckets:
            return self.buckets[bucket]
        unreadable = dict.fromkeys(BUCKET_SETTINGS, "NoSuchBucket")
        return BucketFacts(None, None, None, False, unreadable=unreadable)


# ------------------------------------------- end of SQS, SNS, Auto Scaling and S3 ports' fakes

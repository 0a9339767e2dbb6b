"""In-memory fakes of the ledger's ports, one per DynamoDB adapter, for the unit tests of the use cases.

  FakeLedger  adapters/ledger.py DynamoLedger: InterruptionLedger, StopClaims, TaskIndex and the
              checkpoints' CheckpointLedger (ports.py, usecases/checkpoints.py)
  FakeJobs    adapters/job_store.py DynamoJobs: JobStore (and `count`)
  FakePools   adapters/pool_store.py PoolStore: PoolLedger

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
# and a FakeJobs given the same dict share them, as the two adapters share the table.
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


class FakeJobs:
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


class FakePools:
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

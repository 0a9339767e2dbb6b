"""The job as the ledger holds it: its state and its attempts (the RunTask request and the options it was
submitted with are in domain.jobs.submission), and the names SpotGuard gives its tasks (startedBy, client
tokens, adopted job ids)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.jobs.placement import Move
from spotguard.domain.jobs.submission import MAX_NODES, JobOptions, RunTaskRequest
from spotguard.domain.tasks import JOB_ID, STARTED_BY

ENV_JOB_ID = "SPOTGUARD_JOB_ID"
ENV_ATTEMPT = "SPOTGUARD_ATTEMPT"
ENV_CHECKPOINT_URI = "SPOTGUARD_CHECKPOINT_URI"
ENV_RESUME_FROM = "SPOTGUARD_RESUME_FROM"
# A multi-node job's tasks (a gang, docs/jobs.md "Multi-node jobs") also get their node rank, the node
# count and node 0's address (nodes 1..N-1), as SpotGuard's names and as torchrun's PET_ variables
# (torchrun reads PET_<ARGUMENT> for an argument not given: a plain `torchrun` finds the others).
ENV_NODE_RANK = "SPOTGUARD_NODE_RANK"
ENV_NODES = "SPOTGUARD_NODES"
ENV_RENDEZVOUS = "SPOTGUARD_RENDEZVOUS"
# torchrun's are set (and a request's own replaced) for a multi-node job only: a one-node job may set them.
TORCHRUN_ENV = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_RDZV_CONF")
SPOTGUARD_ENV = (
    ENV_JOB_ID,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_URI,
    ENV_RESUME_FROM,
    ENV_NODE_RANK,
    ENV_NODES,
    ENV_RENDEZVOUS,
)
# The job's ledger item stays under DynamoDB's 400 KB by construction, whatever the door accepts (64 nodes,
# 10 containers named at ECS's 255 characters, attempts without end through resubmits): a task keeps at
# most MAX_EXIT_CODES exit codes, their names clipped; the newest KEEP_ATTEMPTS attempts are kept whole
# and older ones folded into `Job.folded` (what they spent); an ended gang's other nodes are folded too
# (domain.jobs.gangs.compact). tests/contract/test_ledger_item_bound.py builds the worst case.
MAX_EXIT_CODES = 3
EXIT_CODE_NAME = 64
KEEP_ATTEMPTS = 20
MAX_PLACEMENT_CONSTRAINTS = 10  # ECS's limit per task
RETRY_BASE_SECONDS = 30
RETRY_MAX_SECONDS = 900
# The furthest a deadline may be at submit (options.deadline, against the jobs function's clock:
# spotguard.domain.jobs.request.deadline_refused): a year. Not what keeps a decision fast (the plan's work no
# longer grows with the deadline: spotguard.domain.capacity.plans.collapse); it refuses in one line what can
# only be a mistake (a year typed 2286 for 2026), where a job would otherwise take a deadline that means
# nothing. A year is longer than any training run SpotGuard keeps alive and far beyond what the capacity model
# knows (its history halves every week); a job with no deadline is given none.
MAX_DEADLINE_HOURS = 8760


class JobState(StrEnum):
    QUEUED = "queued"  # waiting to be launched (first launch, after a stop, or after RunTask failed)
    LAUNCHING = "launching"  # RunTask is being called for the next attempt
    RUNNING = "running"  # one live attempt (its task is PROVISIONING..RUNNING..STOPPING)
    SNAPSHOTTING = "snapshotting"  # EBS mode: the stopped attempt's volume is being snapshotted
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    GAVE_UP = "gave-up"  # max attempts reached

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.GAVE_UP}


class UnreadableJob(Exception):
    """A job in the ledger that no longer parses: named, with the first reason, in one line. The jobs
    function answers it as an error of this `kind`; the task-events function dead-letters its events."""

    kind = "Unreadable"

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id} cannot be read: {reason}")
        self.job_id = job_id


class JobError(ValueError):
    """A request that cannot be carried out in the job's present state (said in one line)."""


# ----------------------------------------------------------------------------------------- the job
class AvoidedPool(BaseModel):
    model_config = ConfigDict(frozen=True)
    instance_type: str
    availability_zone: str
    until: datetime


class NodeTask(BaseModel):
    """One task of an attempt: what ECS said of it and what it runs on. An attempt is its node 0's task
    (every job's), with the other nodes of a multi-node job's gang in `Attempt.peers`."""

    node: int = Field(default=0, ge=0, lt=MAX_NODES)
    task_arn: str
    client_token: str = ""
    launched_at: datetime
    ecs_version: int = -1  # the highest ECS task event version applied (stale ones are dropped)
    last_status: str = "PROVISIONING"
    container_instance_arn: str | None = None
    instance_id: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None
    capacity_provider: str | None = None
    launch_type: str | None = None
    lifecycle: str | None = None  # spot | on-demand, when known
    price_per_hour: float | None = None  # the task's share of its instance's price, when known
    private_ip: str | None = None  # its network interface's (awsvpc) or its instance's private address
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_codes: dict[str, int | None] = Field(default_factory=dict)
    # A gang's node: what its own stop meant (domain.jobs.stops), before the attempt's outcome, which is
    # decided once every node has stopped (transitions.gang_outcome). Unused for a one-node job.
    verdict: str | None = None
    verdict_reason: str | None = None
    notice: str | None = None  # the notice SpotGuard stopped this node's instance for

    @property
    def stopped(self) -> bool:
        return self.last_status == "STOPPED"


class Attempt(NodeTask):
    number: int = Field(ge=1)
    resume_from: str = ""
    outcome: str | None = None  # succeeded | resubmit | cancelled | failed (see domain.jobs.stops)
    outcome_reason: str | None = None
    interrupted_by: str | None = None  # the notice that stopped it, or the ECS stop code
    volume_id: str | None = None  # EBS mode: the attempt's volume, and the snapshot taken of it
    snapshot_id: str | None = None
    pool: str | None = None  # the pool a capacity decision placed it in, and the market
    market: Literal["spot", "on-demand"] | None = None
    # A gang (nodes > 1): the other nodes' tasks, launched once node 0 runs; when all ran together; why
    # SpotGuard gave up an attempt whose gang did not form (stopped, tried again, not counted); when
    # SpotGuard stopped the nodes still running after one of them stopped. `gang_stopped_at` is also set
    # on a one-node attempt when its job is cancelled: the attempt's stop is under way, asked again by
    # reconcile while a task runs (domain.jobs.gangs.stop_again).
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    peers: list[NodeTask] = Field(default_factory=list)
    formed_at: datetime | None = None
    abandoned: str | None = None
    gang_stopped_at: datetime | None = None
    # An old gang's nodes after the first, folded to keep the job's ledger item small (DynamoDB's 400 KB;
    # domain.jobs.gangs.compact): how many, and their instances' price per hour together (None: unknown).
    folded_peers: int = 0
    folded_price_per_hour: float | None = None

    @property
    def live(self) -> bool:
        return self.outcome is None and not all(t.stopped for t in self.tasks)

    @property
    def tasks(self) -> list[NodeTask]:
        """Every task of the attempt, node 0 (the attempt itself) first."""
        return [self, *self.peers]

    @property
    def gang(self) -> bool:
        return self.nodes > 1

    @property
    def formed(self) -> bool:
        """All its nodes ran together (a one-node attempt: always)."""
        return self.nodes == 1 or self.formed_at is not None

    def node_task(self, task_arn: str) -> NodeTask | None:
        return next((t for t in self.tasks if t.task_arn == task_arn), None)

    def with_node(self, task: NodeTask) -> Attempt:
        """The attempt with one of its tasks replaced (node 0's is the attempt's own fields)."""
        if task.node == 0:
            fields = NodeTask.model_fields
            return revised(self, **{k: v for k, v in dict(task).items() if k in fields})
        return revised(self, peers=[task if p.node == task.node else p for p in self.peers])


SpareState = Literal["asked", "raised", "not-raised", "giving-back", "given-back", "kept"]
SPARE_HOLDS = ("asked", "raised")  # the spare may hold an instance the job has not given back yet


class Spare(BaseModel):
    """The early replacement of an attempt a warning said is going (domain.jobs.spares): the pool its
    successor is to run in, decided at the warning, and the one instance asked of that pool's Auto
    Scaling group for it while the warned task checkpoints. `before`: the group's instances when it was
    asked for, so that the one it added can be told from those already there when it is given back."""

    model_config = ConfigDict(frozen=True)
    attempt: int = Field(ge=1)  # the warned attempt
    notice: str  # the warning's event id
    instance_id: str  # the warned instance
    decision: PlacementDecision  # where the next attempt goes (trigger "warning")
    group: str  # the pool's Auto Scaling group
    cluster: str
    asked_at: datetime
    state: SpareState = "asked"
    before: tuple[str, ...] = ()
    detail: str = Field(default="", max_length=300)
    ended_at: datetime | None = None

    @property
    def holds(self) -> bool:
        return self.state in SPARE_HOLDS


class OutboxItem(BaseModel):
    """A notification written with the transition that caused it and sent after: a Lambda that dies in
    between leaves it here, and whoever handles the job next sends it once its sender's hold has run
    out (`sending_until`: the writer holds what it wrote, and a later reader claims a leftover before it
    sends it, so that two Lambdas handling the job at once do not both send it)."""

    id: str
    kind: str
    message: str
    at: datetime
    detail: dict[str, Any] = Field(default_factory=dict)
    sending_until: datetime | None = None
    held_by: str | None = None  # the write or claim that holds it (a token of its own)

    def free_at(self, now: datetime) -> bool:
        """Nobody holds it at `now`: never held, let go, or its hold has run out."""
        return self.sending_until is None or self.sending_until <= now


class FoldedAttempts(BaseModel):
    """The job's oldest attempts, folded to keep its ledger item small (KEEP_ATTEMPTS): how many, and what
    they spent (GPU-hours and dollars, None when one of them had no known price). What they lost after
    their last checkpoint is not kept."""

    model_config = ConfigDict(frozen=True)
    count: int = Field(default=0, ge=0)
    gpu_hours: float = Field(default=0.0, ge=0)
    dollars: float | None = 0.0
    unformed_tail: int = Field(default=0, ge=0)  # the newest folded ones that were gangs that did not form


class Job(BaseModel):
    job_id: str
    state: JobState
    request: RunTaskRequest
    options: JobOptions = JobOptions()
    checkpoint_uri: str
    gpus: int = Field(default=0, ge=0)
    containers: list[str] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime
    rev: int = 0
    origin: Literal["submitted", "adopted"] = "submitted"
    attempts: list[Attempt] = Field(default_factory=list)
    launch_tries: int = 0  # RunTask calls for the next attempt so far
    retry_at: datetime | None = None
    budget_base: int = 0  # attempts that do not count against max_attempts (before a manual resubmit)
    error_retries_used: int = 0
    cancel_requested: bool = False
    resume_override: str | None = None  # a checkpoint chosen by a manual resubmit, for the next attempt
    avoid_instances: list[str] = Field(default_factory=list)
    avoid_pools: list[AvoidedPool] = Field(default_factory=list)
    ebs_volume: str | None = None  # EBS mode: the task definition's volume configured at launch
    snapshots: list[str] = Field(default_factory=list)  # EBS mode: completed snapshots, oldest first
    doomed_volumes: list[str] = Field(default_factory=list)  # EBS mode: old volumes still to delete
    last_reason: str = ""
    outbox: list[OutboxItem] = Field(default_factory=list)
    decisions: list[PlacementDecision] = Field(default_factory=list)  # capacity decisions, newest last
    placement: PlacementDecision | None = None  # the decision the launch in flight (or next) carries out
    move: Move | None = None  # a move of the live attempt to other capacity, under way
    moves_made: int = 0
    spare: Spare | None = None  # the newest early replacement (domain.jobs.spares)
    folded: FoldedAttempts = FoldedAttempts()  # the oldest attempts, no longer kept whole
    # the token of the write that wrote this version (usecases.jobs.engine): a write whose answer was
    # lost knows itself when it reads the job again
    written_by: str = ""

    @field_validator("job_id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not JOB_ID.fullmatch(v):
            raise ValueError("job ids are 1-64 letters, digits, - and _, starting with a letter or digit")
        return v

    @property
    def live_attempt(self) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if a.live), None)

    @property
    def attempt_count(self) -> int:
        """Every attempt the job has had, the folded ones too."""
        return len(self.attempts) + self.folded.count

    @property
    def next_attempt(self) -> int:
        return self.attempt_count + 1

    @property
    def attempts_used(self) -> int:
        return self.attempt_count - self.budget_base

    @property
    def checkpoint_container(self) -> str | None:
        """The container that runs the agent: the option's, else the task definition's first."""
        return self.options.checkpoint_container or (self.containers[0] if self.containers else None)

    def is_newest(self, attempt: Attempt) -> bool:
        return bool(self.attempts) and attempt.number == self.attempts[-1].number

    def attempt_for(self, task_arn: str) -> Attempt | None:
        """The attempt one of whose tasks (any node's) this is."""
        return next((a for a in self.attempts if a.node_task(task_arn) is not None), None)


def started_by(job_id: str, attempt: int, node: int = 0) -> str:
    return f"{STARTED_BY}/{job_id}/{attempt}" + (f"/{node}" if node else "")


def cancel_reason(job: Job) -> str:
    """The StopTask reason of a task stopped because its job was cancelled."""
    return f"SpotGuard: cancelled job {job.job_id}"[:255]


def adopted_job_id(task_arn: str) -> str:
    """A task SpotGuard adopts becomes the job named after it: two concurrent adoptions of the same task
    write the same job item, and only one of them wins the conditional put."""
    return f"adopted-{task_arn.rsplit('/', 1)[-1]}"[:64]


def client_token(job_id: str, attempt: int, launch_try: int, node: int = 0) -> str:
    """<= 64 printable characters, the same for a repeated call of the same try (of the same node)."""
    raw = f"{job_id}/{attempt}/{launch_try}" + (f"/{node}" if node else "")
    return raw if len(raw) <= 64 else hashlib.sha256(raw.encode()).hexdigest()


M = TypeVar("M", bound=BaseModel)


def revised(model: M, **changes: Any) -> M:
    """A copy of `model` with `changes`, validated: every value taken from an event into a job goes
    through its field's type (model_copy(update=...) would store anything, and a job holding a value
    its own type refuses could no longer be read)."""
    return type(model).model_validate({**dict(model), **changes})


def bump(job: Job, now: datetime, **changes: Any) -> Job:
    return revised(job, updated_at=now, rev=job.rev + 1, **changes)


def replace_attempt(job: Job, attempt: Attempt, now: datetime, **changes: Any) -> Job:
    attempts = [attempt if a.number == attempt.number else a for a in changes.pop("attempts", job.attempts)]
    return bump(job, now, attempts=attempts, **changes)

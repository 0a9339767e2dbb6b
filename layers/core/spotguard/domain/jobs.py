"""A job and its state machine. Pure: no boto3, no clock, no I/O.

A job is one training run that SpotGuard keeps alive: the RunTask request it was submitted with, its
options, and its attempts (one ECS task each). The whole job is one ledger item, written with a
compare-and-set on `rev`, so every transition below is atomic and a job never has two live attempts:

    queued ──launch──► launching ──task started──► running ──task stopped──► succeeded | failed |
      ▲                   │                           │                     cancelled | gave-up
      └──RunTask failed───┘ (retry queue, growing     └──interrupted / exit 75 / error retry──► queued
                              delays)

Every function here takes a job and returns a new one plus the effects to carry out (launch, stop,
notify); the use case writes the new job first and then does the effects, each of which is safe to
repeat (RunTask has a client token, StopTask and notifications are idempotent or harmless twice).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from spotguard.domain.stops import OwnRecord, classify_stop
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, JOB_TAG, STARTED_BY

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# startedBy carries the job and the attempt, so every task event names its job without a lookup.
_STARTED_BY = re.compile(rf"^{STARTED_BY}/(?P<job>[A-Za-z0-9][A-Za-z0-9_-]{{0,63}})/(?P<attempt>\d{{1,4}})$")
ATTEMPT_TAG = "spotguard:attempt"
ENV_JOB_ID = "SPOTGUARD_JOB_ID"
ENV_ATTEMPT = "SPOTGUARD_ATTEMPT"
ENV_CHECKPOINT_URI = "SPOTGUARD_CHECKPOINT_URI"
ENV_RESUME_FROM = "SPOTGUARD_RESUME_FROM"
SPOTGUARD_ENV = (ENV_JOB_ID, ENV_ATTEMPT, ENV_CHECKPOINT_URI, ENV_RESUME_FROM)
MAX_PLACEMENT_CONSTRAINTS = 10  # ECS's limit per task
RETRY_BASE_SECONDS = 30
RETRY_MAX_SECONDS = 900


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


class JobError(ValueError):
    """A request that cannot be carried out in the job's present state (said in one line)."""


# --------------------------------------------------------------------------------- the RunTask request
class Tag(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(min_length=1, max_length=128)
    value: str = Field(default="", max_length=256)


class CapacityProviderItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    capacityProvider: str = Field(min_length=1, max_length=255)
    weight: int | None = Field(default=None, ge=0, le=1000)
    base: int | None = Field(default=None, ge=0, le=100000)


class RunTaskRequest(BaseModel):
    """The part of an ECS RunTask request a job is made of, in the API's own (camelCase) names, so a
    request that works with `aws ecs run-task` works here. SpotGuard sets count (1), startedBy and
    clientToken itself; a request that sets them is refused rather than silently changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cluster: str = Field(min_length=1, max_length=2048)
    taskDefinition: str = Field(min_length=1, max_length=2048)
    overrides: dict[str, Any] | None = None
    launchType: Literal["EC2", "FARGATE", "EXTERNAL"] | None = None
    capacityProviderStrategy: list[CapacityProviderItem] | None = Field(default=None, max_length=20)
    networkConfiguration: dict[str, Any] | None = None
    placementConstraints: list[dict[str, Any]] | None = Field(default=None, max_length=10)
    placementStrategy: list[dict[str, Any]] | None = Field(default=None, max_length=5)
    platformVersion: str | None = None
    tags: list[Tag] | None = Field(default=None, max_length=40)
    propagateTags: Literal["TASK_DEFINITION", "SERVICE", "NONE"] | None = None
    group: str | None = Field(default=None, max_length=255)
    enableExecuteCommand: bool | None = None
    enableECSManagedTags: bool | None = None
    volumeConfigurations: list[dict[str, Any]] | None = None
    count: Literal[1] = 1

    @model_validator(mode="after")
    def _one_placement_kind(self) -> RunTaskRequest:
        if self.launchType and self.capacityProviderStrategy:
            raise ValueError("give either launchType or capacityProviderStrategy, not both")
        for t in self.tags or []:
            if t.key.startswith("aws:"):
                raise ValueError(f"tag {t.key!r}: keys starting with aws: are reserved")
            if t.key in (JOB_TAG, ATTEMPT_TAG, CHECKPOINT_CONTAINER_TAG):
                raise ValueError(f"tag {t.key!r} is set by SpotGuard")
        return self

    @property
    def cluster_name(self) -> str:
        return self.cluster.rsplit("/", 1)[-1]

    @property
    def fargate(self) -> bool:
        if self.launchType == "FARGATE":
            return True
        return any(
            c.capacityProvider in ("FARGATE", "FARGATE_SPOT") for c in self.capacityProviderStrategy or []
        )


class EbsOptions(BaseModel):
    """EBS mode: the managed volume each attempt gets (from the newest snapshot, once there is one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    size_gib: int = Field(default=100, ge=1, le=16384)
    volume_type: Literal["gp3", "gp2", "io1", "io2", "st1", "sc1"] = "gp3"
    filesystem: Literal["ext3", "ext4", "xfs"] = "ext4"
    iops: int | None = Field(default=None, ge=100, le=256000)
    throughput: int | None = Field(default=None, ge=125, le=2000)
    kms_key_id: str | None = Field(default=None, min_length=1, max_length=2048)
    # the role ECS manages the volume with; None: the stack's own (EbsVolumesRole)
    role_arn: str | None = Field(default=None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    keep_snapshots: int = Field(default=2, ge=1, le=20)


class JobOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_attempts: int = Field(default=20, ge=1, le=100)
    max_error_retries: int = Field(default=0, ge=0, le=20)
    # s3: the agent commits to S3; ebs: to the task's managed EBS volume, which SpotGuard snapshots
    # when the task stops and gives to the next attempt (the task definition needs a volume
    # `configuredAtLaunch`). None: ebs when the task definition has such a volume that the checkpoint
    # container mounts and the request does not configure it, else s3.
    checkpoint_mode: Literal["s3", "ebs"] | None = None
    ebs: EbsOptions | None = None
    deadline: AwareDatetime | None = None
    # After an interruption the next attempt stays off the instance for good, and off its spot pool
    # (instance type in that availability zone) for this long.
    avoid_pool_seconds: int = Field(default=1800, ge=0, le=7 * 86400)
    # The container that runs the agent (gets SIGUSR1); None = the first in the task definition.
    checkpoint_container: str | None = Field(default=None, min_length=1, max_length=255)


# ----------------------------------------------------------------------------------------- the job
class Pool(BaseModel):
    model_config = ConfigDict(frozen=True)
    instance_type: str
    availability_zone: str
    until: datetime


class Attempt(BaseModel):
    number: int = Field(ge=1)
    task_arn: str
    client_token: str = ""
    resume_from: str = ""
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
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_codes: dict[str, int | None] = Field(default_factory=dict)
    outcome: str | None = None  # succeeded | resubmit | cancelled | failed (see domain.stops)
    outcome_reason: str | None = None
    interrupted_by: str | None = None  # the notice that stopped it, or the ECS stop code
    volume_id: str | None = None  # EBS mode: the attempt's volume, and the snapshot taken of it
    snapshot_id: str | None = None

    @property
    def live(self) -> bool:
        return self.outcome is None and self.last_status != "STOPPED"


class OutboxItem(BaseModel):
    """A notification written with the transition that caused it and sent after: a Lambda that dies in
    between leaves it here, and whoever handles the job next sends it."""

    id: str
    kind: str
    message: str
    at: datetime
    detail: dict[str, Any] = Field(default_factory=dict)


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
    avoid_pools: list[Pool] = Field(default_factory=list)
    ebs_volume: str | None = None  # EBS mode: the task definition's volume configured at launch
    snapshots: list[str] = Field(default_factory=list)  # EBS mode: completed snapshots, oldest first
    doomed_volumes: list[str] = Field(default_factory=list)  # EBS mode: old volumes still to delete
    last_reason: str = ""
    outbox: list[OutboxItem] = Field(default_factory=list)

    @field_validator("job_id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not JOB_ID.match(v):
            raise ValueError("job ids are 1-64 letters, digits, - and _, starting with a letter or digit")
        return v

    @property
    def live_attempt(self) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if a.live), None)

    @property
    def next_attempt(self) -> int:
        return len(self.attempts) + 1

    @property
    def attempts_used(self) -> int:
        return len(self.attempts) - self.budget_base

    def attempt_for(self, task_arn: str) -> Attempt | None:
        return next((a for a in self.attempts if a.task_arn == task_arn), None)


# ------------------------------------------------------------------------------------ task events
class TaskEvent(BaseModel):
    """What the state machine needs from an ECS Task State Change event (or a DescribeTasks task)."""

    model_config = ConfigDict(frozen=True)
    event_id: str = ""
    task_arn: str
    cluster_arn: str
    version: int = 0
    last_status: str
    desired_status: str = ""
    started_by: str = ""
    task_definition_arn: str = ""
    container_instance_arn: str | None = None
    availability_zone: str | None = None
    capacity_provider: str | None = None
    launch_type: str | None = None
    group: str | None = None
    started_at: datetime | None = None
    stopping_at: datetime | None = None
    stopped_at: datetime | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    containers: tuple[dict[str, Any], ...] = ()
    overrides: dict[str, Any] | None = None
    enable_execute_command: bool | None = None
    time: datetime | None = None

    @property
    def job_ref(self) -> tuple[str, int] | None:
        """(job id, attempt) when SpotGuard started this task."""
        m = _STARTED_BY.match(self.started_by)
        return (m["job"], int(m["attempt"])) if m else None

    @property
    def detail(self) -> dict[str, Any]:
        return {
            "containers": list(self.containers),
            "stopCode": self.stop_code,
            "stoppedReason": self.stopped_reason,
        }


def started_by(job_id: str, attempt: int) -> str:
    return f"{STARTED_BY}/{job_id}/{attempt}"


def adopted_job_id(task_arn: str) -> str:
    """A task SpotGuard adopts becomes the job named after it: two concurrent adoptions of the same task
    write the same job item, and only one of them wins the conditional put."""
    return f"adopted-{task_arn.rsplit('/', 1)[-1]}"[:64]


# ---------------------------------------------------------------------------------------- effects
class Launch(BaseModel):
    """Call RunTask for the job's next attempt (safe to repeat: the client token is fixed per try)."""

    model_config = ConfigDict(frozen=True)
    attempt: int
    client_token: str
    resume_from_hint: str | None = None  # a checkpoint a manual resubmit chose; else the newest


class Snapshot(BaseModel):
    """EBS mode: snapshot the volume of this (stopped) attempt."""

    model_config = ConfigDict(frozen=True)
    attempt: int


class Cleanup(BaseModel):
    """EBS mode: delete volumes no attempt will use again, and snapshots beyond the job's keep."""

    model_config = ConfigDict(frozen=True)
    volumes: tuple[str, ...] = ()
    snapshots: tuple[str, ...] = ()


class Stop(BaseModel):
    model_config = ConfigDict(frozen=True)
    cluster: str
    task_arn: str
    reason: str


class Notify(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["interrupted", "resubmitted", "succeeded", "failed", "gave-up", "cancelled", "waiting"]
    message: str


class CapacityWanted(BaseModel):
    """RunTask found no room: ask for capacity (the rebid policy decides where)."""

    model_config = ConfigDict(frozen=True)
    gpus: int
    reason: str
    avoid_instances: tuple[str, ...] = ()
    avoid_pools: tuple[tuple[str, str], ...] = ()


Effect = Launch | Stop | Notify | CapacityWanted | Snapshot | Cleanup


class Step(BaseModel):
    """A transition: the new job (None = nothing changed) and what to do once it is written."""

    job: Job | None = None
    effects: list[Effect] = Field(default_factory=list)
    note: str = ""


def client_token(job_id: str, attempt: int, launch_try: int) -> str:
    """<= 64 printable characters, the same for a repeated call of the same try."""
    raw = f"{job_id}/{attempt}/{launch_try}"
    return raw if len(raw) <= 64 else hashlib.sha256(raw.encode()).hexdigest()


def _bump(job: Job, now: datetime, **changes: Any) -> Job:
    return job.model_copy(update={"updated_at": now, "rev": job.rev + 1, **changes})


# ------------------------------------------------------------------------------------ transitions
def begin_launch(job: Job, now: datetime) -> Step:
    """queued (and due) -> launching. A job already launching gets its launch again (the Lambda that
    began it may have died before RunTask answered; the same client token returns the same task)."""
    if job.state is JobState.LAUNCHING:
        return Step(job=None, effects=[_launch_effect(job)], note="launch in progress: repeat it")
    if job.state is not JobState.QUEUED:
        return Step(note=f"job is {job.state}, not queued")
    if job.cancel_requested:
        return Step(
            job=_bump(job, now, state=JobState.CANCELLED, last_reason="cancelled before it started"),
            effects=[Notify(kind="cancelled", message="cancelled before it started")],
        )
    if job.retry_at is not None and now < job.retry_at:
        return Step(note=f"not due until {job.retry_at.isoformat()}")
    new = _bump(job, now, state=JobState.LAUNCHING, launch_tries=job.launch_tries + 1, retry_at=None)
    return Step(job=new, effects=[_launch_effect(new)])


def _launch_effect(job: Job) -> Launch:
    return Launch(
        attempt=job.next_attempt,
        client_token=client_token(job.job_id, job.next_attempt, job.launch_tries),
        resume_from_hint=job.resume_override,
    )


def launch_succeeded(
    job: Job, task_arn: str, token: str, resume_from: str, now: datetime, resubmitted: bool
) -> Step:
    if job.attempt_for(task_arn) is not None:
        return Step(note="this task is already the job's attempt")
    if job.state is not JobState.LAUNCHING:
        # The job moved on (cancelled meanwhile): the task must not run.
        return Step(
            effects=[Stop(cluster=job.request.cluster, task_arn=task_arn, reason=stray_reason(job))],
            note=f"job is {job.state}: stopping the task just started",
        )
    attempt = Attempt(
        number=job.next_attempt,
        task_arn=task_arn,
        client_token=token,
        resume_from=resume_from,
        launched_at=now,
    )
    new = _bump(
        job,
        now,
        state=JobState.RUNNING,
        attempts=[*job.attempts, attempt],
        launch_tries=0,
        resume_override=None,
        last_reason=f"attempt {attempt.number} started",
    )
    effects: list[Effect] = []
    if resubmitted:
        where = f" from {resume_from}" if resume_from else " from scratch"
        effects.append(Notify(kind="resubmitted", message=f"attempt {attempt.number} started{where}"))
    return Step(job=new, effects=effects)


def retry_delay(launch_tries: int, base: int = RETRY_BASE_SECONDS) -> int:
    """30 s, 60 s, 120 s ... up to 15 min (SQS's longest delay) between RunTask tries."""
    return int(min(RETRY_MAX_SECONDS, base * 2 ** max(0, launch_tries - 1)))


def launch_failed(job: Job, reason: str, now: datetime, base_delay: int = RETRY_BASE_SECONDS) -> Step:
    """RunTask placed nothing: back to queued, due again after a growing delay; ask for capacity."""
    if job.state is not JobState.LAUNCHING:
        return Step(note=f"job is {job.state}, not launching")
    delay = retry_delay(job.launch_tries, base_delay)
    new = _bump(
        job,
        now,
        state=JobState.QUEUED,
        retry_at=now + timedelta(seconds=delay),
        last_reason=f"RunTask placed no task: {reason}; next try in {delay} s",
    )
    pools = tuple((p.instance_type, p.availability_zone) for p in job.avoid_pools if p.until > now)
    return Step(
        job=new,
        effects=[
            CapacityWanted(
                gpus=job.gpus, reason=reason, avoid_instances=tuple(job.avoid_instances), avoid_pools=pools
            ),
            Notify(kind="waiting", message=f"no capacity ({reason}); next try in {delay} s"),
        ],
    )


def launch_refused(job: Job, reason: str, now: datetime) -> Step:
    """RunTask said the request itself is wrong (a deregistered task definition, a bad subnet): no
    retry can help, so the job fails and says why."""
    if job.state is not JobState.LAUNCHING:
        return Step(note=f"job is {job.state}, not launching")
    why = f"RunTask refused the request: {reason}"
    return Step(
        job=_bump(job, now, state=JobState.FAILED, last_reason=why),
        effects=[Notify(kind="failed", message=why)],
    )


def on_task_event(job: Job, ev: TaskEvent, own_stop_notice: str | None, now: datetime) -> Step:
    """Apply one task event. Stale and repeated events (version not above the last applied) change
    nothing; a task that is not one of the job's attempts and still runs is stopped."""
    attempt = job.attempt_for(ev.task_arn)
    if attempt is None and job.state is JobState.LAUNCHING and ev.job_ref == (job.job_id, job.next_attempt):
        # The task of the launch in flight, seen before RunTask's answer was written (or after the Lambda
        # that called it died): bind it, then apply the event to it.
        bound = launch_succeeded(
            job,
            ev.task_arn,
            client_token(job.job_id, job.next_attempt, job.launch_tries),
            _env_of(ev.overrides).get(ENV_RESUME_FROM, ""),
            now,
            resubmitted=job.next_attempt > 1,
        )
        assert bound.job is not None
        step = on_task_event(bound.job, ev, own_stop_notice, now)
        return Step(job=step.job or bound.job, effects=[*bound.effects, *step.effects], note=step.note)
    if attempt is None:
        if ev.last_status == "STOPPED" or ev.desired_status == "STOPPED":
            return Step(note="a task that is not one of the job's attempts, already stopping")
        return Step(
            effects=[Stop(cluster=ev.cluster_arn, task_arn=ev.task_arn, reason=stray_reason(job))],
            note="a task that is not the job's live attempt: stopped so the job never runs twice",
        )
    if ev.version <= attempt.ecs_version:
        return Step(note=f"stale or repeated event (version {ev.version} <= {attempt.ecs_version})")

    updated = _observe(attempt, ev, own_stop_notice)
    effects: list[Effect] = []
    changes: dict[str, Any] = {}
    if ev.last_status != "STOPPED":
        if job.cancel_requested or job.state.terminal:
            effects.append(Stop(cluster=ev.cluster_arn, task_arn=ev.task_arn, reason=cancel_reason(job)))
        elif (
            ev.desired_status == "STOPPED"
            and ev.stop_code == "SpotInterruption"
            and attempt.interrupted_by is None
        ):
            updated = updated.model_copy(update={"interrupted_by": "SpotInterruption"})
            effects.append(
                Notify(kind="interrupted", message=f"attempt {attempt.number}: Fargate Spot interruption")
            )
        return Step(job=_replace_attempt(job, updated, now, **changes), effects=effects)

    # ------------------------------------------------------------------------------ the task stopped
    if not (job.state is JobState.RUNNING and attempt.number == len(job.attempts)):
        # An older attempt, or a job that already moved on: record what happened, nothing more.
        return Step(job=_replace_attempt(job, updated, now))
    verdict = classify_stop(
        ev.detail,
        OwnRecord(stopped_for_notice=own_stop_notice, cancelled=job.cancel_requested),
        job.options.checkpoint_container or (job.containers[0] if job.containers else None),
    )
    updated = updated.model_copy(update={"outcome": verdict.outcome, "outcome_reason": verdict.reason})
    n = attempt.number
    if verdict.outcome == "succeeded":
        return Step(
            job=_replace_attempt(job, updated, now, state=JobState.SUCCEEDED, last_reason=verdict.reason),
            effects=[Notify(kind="succeeded", message=f"attempt {n}: {verdict.reason}")],
        )
    if verdict.outcome == "cancelled":
        return Step(
            job=_replace_attempt(job, updated, now, state=JobState.CANCELLED, last_reason=verdict.reason),
            effects=[Notify(kind="cancelled", message=f"attempt {n}: {verdict.reason}")],
        )
    if verdict.outcome == "resubmit":
        updated = updated.model_copy(update={"interrupted_by": updated.interrupted_by or verdict.reason})
        effects = [Notify(kind="interrupted", message=f"attempt {n}: {verdict.reason}")]
        changes = _avoidance(job, updated, now)
    else:  # failed
        if job.error_retries_used >= job.options.max_error_retries:
            return Step(
                job=_replace_attempt(job, updated, now, state=JobState.FAILED, last_reason=verdict.reason),
                effects=[Notify(kind="failed", message=f"attempt {n}: {verdict.reason}")],
            )
        changes = {"error_retries_used": job.error_retries_used + 1}
    if job.attempts_used >= job.options.max_attempts:
        used, most = job.attempts_used, job.options.max_attempts
        why = f"{used} attempts used (max_attempts {most}); last: {verdict.reason}"
        return Step(
            job=_replace_attempt(job, updated, now, state=JobState.GAVE_UP, last_reason=why),
            effects=[*effects, Notify(kind="gave-up", message=why)],
        )
    next_state = JobState.SNAPSHOTTING if job.ebs_volume else JobState.QUEUED
    requeued = _replace_attempt(
        job,
        updated,
        now,
        state=next_state,
        retry_at=None,
        launch_tries=0,
        last_reason=verdict.reason,
        **changes,
    )
    if job.ebs_volume:
        effects.append(Snapshot(attempt=n))
    return Step(job=requeued, effects=effects)


def _env_of(overrides: Mapping[str, Any] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for c in (overrides or {}).get("containerOverrides") or []:
        for e in c.get("environment") or []:
            if isinstance(e, Mapping) and e.get("name") in SPOTGUARD_ENV:
                env[str(e["name"])] = str(e.get("value", ""))
    return env


def _observe(attempt: Attempt, ev: TaskEvent, own_stop_notice: str | None) -> Attempt:
    changes: dict[str, Any] = {"ecs_version": ev.version, "last_status": ev.last_status}
    for field, value in (
        ("container_instance_arn", ev.container_instance_arn),
        ("availability_zone", ev.availability_zone),
        ("capacity_provider", ev.capacity_provider),
        ("launch_type", ev.launch_type),
        ("started_at", ev.started_at),
        ("stopped_at", ev.stopped_at),
        ("stop_code", ev.stop_code),
        ("stopped_reason", ev.stopped_reason),
    ):
        if value is not None:
            changes[field] = value
    if ev.containers:
        changes["exit_codes"] = {str(c.get("name", "")): c.get("exitCode") for c in ev.containers}
    if own_stop_notice and attempt.interrupted_by is None:
        changes["interrupted_by"] = own_stop_notice
    if ev.last_status == "STOPPED" and ev.stopped_at is None:
        changes["stopped_at"] = ev.time or ev.stopping_at
    return attempt.model_copy(update=changes)


def _replace_attempt(job: Job, attempt: Attempt, now: datetime, **changes: Any) -> Job:
    attempts = [attempt if a.number == attempt.number else a for a in job.attempts]
    return _bump(job, now, attempts=attempts, **changes)


def _avoidance(job: Job, attempt: Attempt, now: datetime) -> dict[str, Any]:
    """Remember the interrupted instance for good and its spot pool for `avoid_pool_seconds`."""
    instances = list(job.avoid_instances)
    if attempt.instance_id and attempt.instance_id not in instances:
        instances = [*instances, attempt.instance_id][-20:]
    pools = [p for p in job.avoid_pools if p.until > now]
    if attempt.instance_type and attempt.availability_zone and job.options.avoid_pool_seconds > 0:
        pools = [
            p
            for p in pools
            if (p.instance_type, p.availability_zone) != (attempt.instance_type, attempt.availability_zone)
        ]
        pools.append(
            Pool(
                instance_type=attempt.instance_type,
                availability_zone=attempt.availability_zone,
                until=now + timedelta(seconds=job.options.avoid_pool_seconds),
            )
        )
    return {"avoid_instances": instances, "avoid_pools": pools}


def snapshot_started(
    job: Job, attempt: int, volume_id: str | None, snapshot_id: str | None, now: datetime
) -> Step:
    """EBS mode: the attempt's volume and its snapshot (None: the volume is gone, nothing to snapshot)."""
    if job.state is not JobState.SNAPSHOTTING:
        return Step(note=f"job is {job.state}, not snapshotting")
    a = next((x for x in job.attempts if x.number == attempt), None)
    if a is None or (snapshot_id is not None and (a.volume_id, a.snapshot_id) == (volume_id, snapshot_id)):
        return Step(note="nothing new about the snapshot")
    updated = a.model_copy(update={"volume_id": volume_id, "snapshot_id": snapshot_id})
    if snapshot_id is None:  # no volume to snapshot: go on from the newest snapshot there is
        return snapshot_finished(
            _replace_attempt(job, updated, now), None, False, now, "its volume was not found"
        )
    return Step(job=_replace_attempt(job, updated, now))


def snapshot_finished(job: Job, snapshot_id: str | None, ok: bool, now: datetime, why: str = "") -> Step:
    """EBS mode: the stopped attempt's snapshot completed (the next attempt starts from it) or failed
    (it starts from the newest snapshot before it, or from scratch). Either way the job is queued."""
    if job.state is not JobState.SNAPSHOTTING:
        return Step(note=f"job is {job.state}, not snapshotting")
    last = job.attempts[-1]
    if snapshot_id is not None and last.snapshot_id != snapshot_id:
        return Step(note=f"snapshot {snapshot_id} is not the one the job waits for")
    keep = (job.options.ebs or EbsOptions()).keep_snapshots
    snapshots = [*job.snapshots, snapshot_id] if ok and snapshot_id else list(job.snapshots)
    expired, kept = snapshots[:-keep], snapshots[-keep:]
    if not ok and snapshot_id:
        expired.append(snapshot_id)  # a failed snapshot is of no use
    volumes = [*job.doomed_volumes, *([last.volume_id] if ok and last.volume_id else [])]
    if ok:
        reason = f"attempt {last.number}'s volume is snapshotted ({snapshot_id})"
    else:
        start = kept[-1] if kept else "scratch"
        reason = (
            f"the snapshot of attempt {last.number} failed{': ' + why if why else ''}; resuming from {start}"
        )
    new = _bump(job, now, state=JobState.QUEUED, snapshots=kept, doomed_volumes=volumes, last_reason=reason)
    effects: list[Effect] = []
    if volumes or expired:
        effects.append(Cleanup(volumes=tuple(volumes), snapshots=tuple(expired)))
    if not ok:
        effects.append(Notify(kind="waiting", message=reason))
    return Step(job=new, effects=effects)


def volumes_deleted(job: Job, deleted: list[str], now: datetime) -> Step:
    left = [v for v in job.doomed_volumes if v not in deleted]
    if left == job.doomed_volumes:
        return Step(note="no volume deleted")
    return Step(job=_bump(job, now, doomed_volumes=left))


def request_cancel(job: Job, now: datetime, reason: str) -> Step:
    if job.state.terminal:
        raise JobError(f"job {job.job_id} is already {job.state}")
    live = job.live_attempt
    idle = job.state in (JobState.QUEUED, JobState.SNAPSHOTTING)
    if idle or (job.state is JobState.LAUNCHING and live is None):
        # Launching: the RunTask in flight, if it succeeds, finds the job cancelled and stops the task.
        return Step(
            job=_bump(job, now, state=JobState.CANCELLED, cancel_requested=True, last_reason=reason),
            effects=[Notify(kind="cancelled", message=reason)],
        )
    new = _bump(job, now, cancel_requested=True, last_reason=reason)
    effects: list[Effect] = []
    if live is not None:
        effects.append(Stop(cluster=job.request.cluster, task_arn=live.task_arn, reason=cancel_reason(job)))
    return Step(job=new, effects=effects)


def request_resubmit(job: Job, now: datetime, checkpoint: str | None) -> Step:
    """A manual resubmit: a job that is not running starts again (a fresh attempt budget and error
    retries), from `checkpoint` if given, else from its newest committed checkpoint."""
    if job.state is JobState.SNAPSHOTTING:
        raise JobError(f"job {job.job_id} is snapshotting its volume; it starts again by itself after that")
    if job.state in (JobState.RUNNING, JobState.LAUNCHING):
        live = job.live_attempt
        task = f" (task {live.task_arn})" if live else ""
        raise JobError(f"job {job.job_id} is {job.state}{task}: cancel it first, it never runs twice")
    new = _bump(
        job,
        now,
        state=JobState.QUEUED,
        retry_at=None,
        launch_tries=0,
        budget_base=len(job.attempts),
        error_retries_used=0,
        cancel_requested=False,
        resume_override=checkpoint,
        last_reason="resubmitted by hand",
    )
    return Step(job=new)


def cancel_reason(job: Job) -> str:
    return f"SpotGuard: cancelled job {job.job_id}"[:255]


def stray_reason(job: Job) -> str:
    return f"SpotGuard: job {job.job_id} has another live attempt (or none)"[:255]


# ------------------------------------------------------------------------------- the RunTask call
def run_task_params(
    job: Job, launch: Launch, resume_from: str, avoid_at: datetime, ebs_role: str | None = None
) -> dict[str, Any]:
    """The RunTask parameters for an attempt: the job's request, the SpotGuard environment in every
    container, the attempt's startedBy, tags and client token, and constraints away from the
    interrupted instances and (for a while) their spot pools."""
    params = job.request.model_dump(mode="json", exclude_none=True)
    env = {
        ENV_JOB_ID: job.job_id,
        ENV_ATTEMPT: str(launch.attempt),
        ENV_CHECKPOINT_URI: job.checkpoint_uri,
        ENV_RESUME_FROM: resume_from,
    }
    params["overrides"] = _with_env(params.get("overrides") or {}, job.containers, env)
    params["startedBy"] = started_by(job.job_id, launch.attempt)
    params["clientToken"] = launch.client_token
    params["tags"] = [
        *(params.get("tags") or []),
        {"key": JOB_TAG, "value": job.job_id},
        {"key": ATTEMPT_TAG, "value": str(launch.attempt)},
    ]
    if job.options.checkpoint_container:  # where the interruption path sends SIGUSR1
        params["tags"].append({"key": CHECKPOINT_CONTAINER_TAG, "value": job.options.checkpoint_container})
    if job.ebs_volume:
        params["volumeConfigurations"] = [ebs_volume_configuration(job, launch.attempt, ebs_role)]
    if not job.request.fargate:  # Fargate takes no placement constraints
        constraints = list(params.get("placementConstraints") or [])
        room = MAX_PLACEMENT_CONSTRAINTS - len(constraints)
        constraints += avoid_constraints(job.avoid_instances, job.avoid_pools, avoid_at)[: max(0, room)]
        if constraints:
            params["placementConstraints"] = constraints
    return params


def ebs_volume_configuration(job: Job, attempt: int, default_role: str | None) -> dict[str, Any]:
    """The managed EBS volume of an attempt: from the newest completed snapshot, kept when the task
    stops (SpotGuard snapshots it, then deletes it), tagged with the job and the attempt."""
    o = job.options.ebs or EbsOptions()
    role = o.role_arn or default_role
    if not role:
        raise JobError("EBS mode needs a role for ECS to manage the volume (options.ebs.role_arn)")
    volume: dict[str, Any] = {
        "sizeInGiB": o.size_gib,
        "volumeType": o.volume_type,
        "filesystemType": o.filesystem,
        "roleArn": role,
        "encrypted": True,
        "terminationPolicy": {"deleteOnTermination": False},
        "tagSpecifications": [
            {
                "resourceType": "volume",
                "tags": [
                    {"key": JOB_TAG, "value": job.job_id},
                    {"key": ATTEMPT_TAG, "value": str(attempt)},
                ],
                "propagateTags": "NONE",
            }
        ],
    }
    for key, value in (("iops", o.iops), ("throughput", o.throughput), ("kmsKeyId", o.kms_key_id)):
        if value is not None:
            volume[key] = value
    if job.snapshots:
        volume["snapshotId"] = job.snapshots[-1]
    return {"name": job.ebs_volume, "managedEBSVolume": volume}


def avoid_constraints(instances: Sequence[str], pools: Sequence[Pool], now: datetime) -> list[dict[str, str]]:
    """memberOf constraints in the cluster query language: off these instances, and off each spot pool
    (instance type in an availability zone) while it is avoided."""
    out: list[dict[str, str]] = []
    if instances:
        out.append({"type": "memberOf", "expression": f"ec2InstanceId !in [{', '.join(instances)}]"})
    for p in sorted(pools, key=lambda p: p.until, reverse=True):
        if p.until > now:
            out.append(
                {
                    "type": "memberOf",
                    "expression": f"attribute:ecs.instance-type != {p.instance_type} or "
                    f"attribute:ecs.availability-zone != {p.availability_zone}",
                }
            )
    return out


def _with_env(
    overrides: Mapping[str, Any], containers: Sequence[str], env: Mapping[str, str]
) -> dict[str, Any]:
    """Container overrides with the SpotGuard environment set (replacing any earlier SPOTGUARD_ values)
    in every container of the task definition and every container the request overrides."""
    out = dict(overrides)
    by_name: dict[str, dict[str, Any]] = {}
    for c in overrides.get("containerOverrides") or []:
        by_name[str(c.get("name", ""))] = dict(c)
    for name in containers:
        by_name.setdefault(name, {"name": name})
    result = []
    for name, c in by_name.items():
        kept = [e for e in c.get("environment") or [] if e.get("name") not in SPOTGUARD_ENV]
        c["environment"] = [*kept, *({"name": k, "value": v} for k, v in env.items())]
        c["name"] = name
        result.append(c)
    out["containerOverrides"] = result
    return out


# --------------------------------------------------------------------------------- money and time
class Spend(BaseModel):
    gpu_hours: float = 0.0
    gpu_hours_lost: float = 0.0
    dollars: float | None = None
    dollars_lost: float | None = None


def spend(job: Job, checkpoint_times: Mapping[int, list[datetime]], now: datetime) -> Spend:
    """GPU-hours and money spent per attempt, and lost: the time an attempt ran after its last committed
    checkpoint (all of it, when it committed none) and that the next attempt had to do again."""
    total = lost = 0.0
    dollars = dollars_lost = 0.0
    priced = True
    for a in job.attempts:
        if a.started_at is None:
            continue
        end = a.stopped_at or now
        hours = max(0.0, (end - a.started_at).total_seconds() / 3600)
        wasted = 0.0
        if a.outcome in ("resubmit", "failed", "cancelled"):
            commits = [t for t in checkpoint_times.get(a.number, []) if a.started_at <= t <= end]
            since = max(commits) if commits else a.started_at
            wasted = max(0.0, (end - since).total_seconds() / 3600)
        total += hours * max(job.gpus, 1)
        lost += wasted * max(job.gpus, 1)
        if a.price_per_hour is None:
            priced = False
        else:
            dollars += hours * a.price_per_hour
            dollars_lost += wasted * a.price_per_hour
    return Spend(
        gpu_hours=round(total, 4),
        gpu_hours_lost=round(lost, 4),
        dollars=round(dollars, 4) if priced else None,
        dollars_lost=round(dollars_lost, 4) if priced else None,
    )

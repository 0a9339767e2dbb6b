"""What the jobs function answers about a job: a summary (`list`, `submit`, `cancel`, `resubmit`) and the
full status (`status`). Pure.

These are the wire format users and the CLI read (docs/jobs.md): times as ISO 8601 with their offset, a
field that has no value as null (never left out). The status's parts that are the job's own records
(the request, attempts, checkpoints, decisions) are given as those records dump, their empty fields left
out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, PlainSerializer

from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.model import TERMINAL, Job, JobState
from spotguard.domain.jobs.spend import spend

# datetime.isoformat(), as the answers have always given times ("+00:00", not pydantic's "Z")
IsoTime = Annotated[datetime, PlainSerializer(lambda t: t.isoformat(), return_type=str, when_used="json")]


# a one-node job's attempt says nothing of gangs (its answer as before multi-node jobs)
ONE_NODE_UNSAID = {"nodes", "peers", "folded_peers", "folded_price_per_hour"}


class _Job(BaseModel):
    """What a summary and a status both say of a job."""

    model_config = ConfigDict(frozen=True)
    job_id: str
    state: JobState
    origin: Literal["submitted", "adopted"]
    gpus: int  # per node
    nodes: int  # a multi-node job's nodes (1: one task an attempt)
    task_arn: str | None  # the live attempt's task (node 0's; or the last one's)
    instance_type: str | None
    checkpoint_uri: str
    created_at: IsoTime
    updated_at: IsoTime
    retry_at: IsoTime | None
    finished: bool
    last_reason: str
    decision: str | None  # the newest capacity decision, in a sentence

    @staticmethod
    def common(job: Job) -> dict[str, Any]:
        shown = job.live_attempt or (job.attempts[-1] if job.attempts else None)
        return {
            "job_id": job.job_id,
            "state": job.state,
            "origin": job.origin,
            "gpus": job.gpus,
            "nodes": job.options.nodes,
            "task_arn": shown.task_arn if shown else None,
            "instance_type": shown.instance_type if shown else None,
            "checkpoint_uri": job.checkpoint_uri,
            "created_at": job.created_at,
            "updated_at": job.updated_at,
            "retry_at": job.retry_at,
            "finished": job.state in TERMINAL,
            "last_reason": job.last_reason,
            "decision": job.decisions[-1].summary() if job.decisions else None,
        }


class JobSummary(_Job):
    """A job in a line. `attempts`: how many there have been."""

    attempts: int

    @classmethod
    def of(cls, job: Job) -> JobSummary:
        return cls(**cls.common(job), attempts=job.attempt_count)


class JobStatus(_Job):
    """A job whole: its request and options, every attempt, checkpoint, snapshot and capacity decision,
    what it has spent, a move under way, and what it avoids now."""

    request: dict[str, Any]
    options: dict[str, Any]
    attempts: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    snapshots: list[Any]  # EBS mode: the volumes' snapshots, oldest first
    spend: dict[str, Any]
    decisions: list[dict[str, Any]]  # every capacity decision, newest last
    move: dict[str, Any] | None
    moves_made: int
    spare: dict[str, Any] | None  # the newest early replacement (its pool, group, state), if any
    avoiding: dict[str, Any]
    folded_attempts: int = 0  # the oldest attempts, not kept whole (their spend is in `spend`)

    @classmethod
    def of(cls, job: Job, refs: Sequence[CheckpointRef], now: datetime) -> JobStatus:
        by_attempt: dict[int, list[datetime]] = {}
        for r in refs:
            if r.created_at is not None:
                by_attempt.setdefault(r.attempt, []).append(r.created_at)
        return cls(
            **cls.common(job),
            request=job.request.model_dump(mode="json", exclude_none=True),
            options=job.options.model_dump(mode="json"),
            attempts=[
                a.model_dump(mode="json", exclude_none=True, exclude=None if a.gang else ONE_NODE_UNSAID)
                for a in job.attempts
            ],
            checkpoints=[r.model_dump(mode="json", exclude_none=True) for r in refs],
            snapshots=list(job.snapshots),
            spend=spend(job, by_attempt, now).model_dump(mode="json"),
            decisions=[d.model_dump(mode="json", exclude_none=True) for d in job.decisions],
            move=job.move.model_dump(mode="json", exclude_none=True) if job.move else None,
            moves_made=job.moves_made,
            spare=job.spare.model_dump(mode="json", exclude_none=True, exclude={"before"})
            if job.spare
            else None,
            avoiding={
                "instances": job.avoid_instances,
                "pools": [p.model_dump(mode="json") for p in job.avoid_pools if p.until > now],
            },
            folded_attempts=job.folded.count,
        )

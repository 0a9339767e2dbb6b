"""What a transition asks the use case to do once the new job is written (each safe to repeat), and the
`Step` every transition returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spotguard.domain.jobs.model import Job


class Launch(BaseModel):
    """Call RunTask for the job's next attempt (safe to repeat: the client token is fixed per try)."""

    model_config = ConfigDict(frozen=True)
    attempt: int
    client_token: str
    resume_from_hint: str | None = None  # a checkpoint a manual resubmit chose; else the newest


class LaunchPeers(BaseModel):
    """A gang's node 0 runs: call RunTask for the attempt's nodes not launched yet, each told node 0's
    address (safe to repeat: each node's client token is fixed per attempt)."""

    model_config = ConfigDict(frozen=True)
    attempt: int


class LaunchLater(BaseModel):
    """Schedule the retry message that brings the queued job back after `delay_seconds` (its try
    `launch_try`): a job that waits must have something that ends the wait."""

    model_config = ConfigDict(frozen=True)
    launch_try: int
    delay_seconds: int


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
    kind: Literal[
        "interrupted", "resubmitted", "succeeded", "failed", "gave-up", "cancelled", "waiting", "decision"
    ]
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class Checkpoint(BaseModel):
    """Ask the attempt's checkpoint container to commit a checkpoint now and keep going (SIGUSR1)."""

    model_config = ConfigDict(frozen=True)
    attempt: int


class CapacityWanted(BaseModel):
    """RunTask found no room: ask for capacity (the rebid policy decides where)."""

    model_config = ConfigDict(frozen=True)
    gpus: int
    reason: str
    avoid_instances: tuple[str, ...] = ()
    avoid_pools: tuple[tuple[str, str], ...] = ()


class RaiseSpare(BaseModel):
    """Ask the job's spare of its pool's Auto Scaling group: one instance more (domain.jobs.spares).
    Carried out once: the spare is written before it, and a repeated warning finds it."""

    model_config = ConfigDict(frozen=True)
    attempt: int
    group: str


class GiveBackSpare(BaseModel):
    """Give the spare back: terminate an instance the group added since `before` that runs no task,
    unless other jobs' spares in the group still wait for it (`usecases.jobs.spares`)."""

    model_config = ConfigDict(frozen=True)
    attempt: int
    cluster: str
    group: str
    before: tuple[str, ...] = ()


Effect = (
    Launch
    | LaunchPeers
    | LaunchLater
    | Stop
    | Notify
    | CapacityWanted
    | Snapshot
    | Cleanup
    | Checkpoint
    | RaiseSpare
    | GiveBackSpare
)


class Step(BaseModel):
    """A transition: the new job (None = nothing changed) and what to do once it is written."""

    job: Job | None = None
    effects: list[Effect] = Field(default_factory=list)
    note: str = ""


# A transition: a job in, the new job and its effects out (transitions.py, launches.py, endings.py, ebs.py,
# gangs.py, spares.py).
Transition = Callable[[Job], Step]

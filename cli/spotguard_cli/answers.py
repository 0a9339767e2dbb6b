"""The jobs function's answers as the CLI reads them: parsed once (`read_answer`, `read_status`) into
typed views that every reader uses by attribute (the tables, `jobs logs`, `--watch`, `--plot`, the local
demos and the replay).

The CLI may talk to a stack of another version, so the views are lenient where the function's own models
are strict to write (spotguard.domain.jobs.answers, and the job's records it dumps: extra fields
forbidden, fields required): a field a view does not know (a newer stack's) is ignored, one it knows but
is not sent (an older stack's) takes a default, and a view holds only the fields some reader uses. Where
a domain model is already as lenient (`Spend`, `ErrorBody`) it is the view. An answer that cannot be
read at all (not a JSON object, a field of the wrong kind) is an `AnswerError`, said in one line.

Every field a view names is one the function sends: tests/unit/test_cli_answers.py holds them to the
function's models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from spotguard.domain.errors import one_line
from spotguard.domain.jobs.commands import ErrorBody
from spotguard.domain.jobs.spend import Spend


class AnswerError(ValueError):
    """An answer that cannot be read, or a status asked of one that holds none (its error, when the
    function refused): in one line."""


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


Time = Annotated[datetime, AfterValidator(_aware)]  # a time without a zone is read as UTC


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# -------------------------------------------------------------------------------- a status's records
class NodeView(_View):
    """One task of an attempt: a one-node job's attempt is its only task; a multi-node job's attempt is
    node 0's task, with the other nodes' in `AttemptView.peers`."""

    node: int = 0
    task_arn: str = ""
    launched_at: Time | None = None
    started_at: Time | None = None
    stopped_at: Time | None = None
    last_status: str | None = None
    instance_id: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None
    lifecycle: str | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_codes: dict[str, int | None] = Field(default_factory=dict)
    # a multi-node job's node: what its own stop meant, before the attempt's one outcome
    verdict: str | None = None
    verdict_reason: str | None = None

    @property
    def stopped(self) -> bool:
        return self.last_status == "STOPPED"


class AttemptView(NodeView):
    number: int = 0
    resume_from: str = ""  # the checkpoint's MANIFEST.json it resumed from ("": none)
    pool: str | None = None
    market: str | None = None
    outcome: str | None = None
    outcome_reason: str | None = None
    interrupted_by: str | None = None
    snapshot_id: str | None = None
    # a multi-node job (a stack that has them; an older stack's attempt is one node): the other nodes'
    # tasks, when every node ran together, why the gang was given up before it formed, when SpotGuard
    # stopped the nodes still running after one of them stopped, and how many of an old gang's nodes
    # after the first the ledger folded into a count (their records are not kept)
    nodes: int = 1
    peers: list[NodeView] = Field(default_factory=list)
    formed_at: Time | None = None
    abandoned: str | None = None
    gang_stopped_at: Time | None = None
    folded_peers: int = 0

    @property
    def tasks(self) -> list[NodeView]:
        """Every task of the attempt, node 0 (the attempt itself) first."""
        return [self, *self.peers]

    @property
    def gang(self) -> bool:
        return self.nodes > 1 or bool(self.peers) or self.folded_peers > 0

    @property
    def live(self) -> bool:
        return not self.outcome and not all(t.stopped for t in self.tasks)


class CheckpointView(_View):
    sequence: int = 0
    manifest_uri: str = ""
    step: int = 0
    counts: str = "steps"  # what `step` counts: the job's steps, or the agent's wrapper's commits
    progress: float = 0.0
    attempt: int = 0
    created_at: Time | None = None

    @property
    def step_label(self) -> str:
        """`step N`, or `wrapper commit N` (the wrapper knows nothing of the job's steps)."""
        return f"{'wrapper commit' if self.counts == 'commits' else 'step'} {self.step}"


class DecisionView(_View):
    at: Time | None = None
    trigger: str | None = None
    placement: str | None = None  # spot, on-demand, or none (wait)
    pool: str | None = None
    reason: str = ""
    expected_cost: float | None = None
    work_left_hours: float | None = None  # what the policy was told (the capacity demo's --json shows it)
    time_left_hours: float | None = None
    restart_hours: float | None = None


class MoveView(_View):
    attempt: int = 0
    to: DecisionView = DecisionView()
    requested_at: Time | None = None


class SpareView(_View):
    """The early replacement's spare instance (docs/capacity.md)."""

    attempt: int = 0
    group: str = ""
    state: str = ""
    detail: str = ""
    asked_at: Time | None = None
    decision: DecisionView = DecisionView()


class RequestView(_View):
    cluster: str = ""
    taskDefinition: str = ""


class OptionsView(_View):
    deadline: Time | None = None
    nodes: int = 1  # a multi-node job's node count (an older stack's job: one)


# ------------------------------------------------------------------------------------------- a job
class _JobView(_View):
    """What a summary and a status both say of a job."""

    job_id: str = ""
    state: str = ""  # a JobState's value (a newer stack's state is read too)
    gpus: int = 0
    task_arn: str | None = None
    checkpoint_uri: str = ""
    updated_at: Time | None = None
    retry_at: Time | None = None
    last_reason: str = ""


class SummaryView(_JobView):
    """A job in a line (`list`, `submit`, `cancel`, `resubmit`): its attempts counted."""

    attempts: int = 0
    nodes: int = 1  # a multi-node job's nodes (an older stack's answer does not say: one)


class StatusView(_JobView):
    """A job whole (`status`)."""

    request: RequestView = RequestView()
    options: OptionsView = OptionsView()
    attempts: list[AttemptView] = Field(default_factory=list)
    checkpoints: list[CheckpointView] = Field(default_factory=list)
    snapshots: list[str] = Field(default_factory=list)
    spend: Spend | None = None
    decisions: list[DecisionView] = Field(default_factory=list)  # newest last
    move: MoveView | None = None
    moves_made: int = 0
    spare: SpareView | None = None  # a stack with the early replacement
    folded_attempts: int = 0  # the oldest attempts, not kept whole by the ledger (spend still counts them)

    @property
    def nodes(self) -> int:
        """How many nodes the job runs on: its option, or its attempts' when the answer has none."""
        return max([self.options.nodes, *(a.nodes for a in self.attempts)])


# ---------------------------------------------------------------------------------------- an answer
class _Answer(_View):
    ok: bool
    action: str | None = None
    jobs: list[SummaryView] | None = None
    error: ErrorBody | None = None

    def error_line(self) -> str:
        """The function's refusal as the CLI says it: 'NotFound: job j1 does not exist'."""
        err = self.error or ErrorBody(type="Error", message="")
        return f"{err.type}: {err.message}"

    def status(self) -> StatusView:
        """The job of an ok `status` answer; AnswerError with the function's error when it refused, or
        when the answer holds no status."""
        if not self.ok:
            raise AnswerError(self.error_line())
        raise AnswerError("not a status answer: its job lists no attempts")


class SummaryAnswer(_Answer):
    job: SummaryView | None = None

    @model_validator(mode="after")
    def _says_something(self) -> SummaryAnswer:
        if self.ok and self.job is None and self.jobs is None:
            raise ValueError("an ok answer with neither a job nor jobs")
        return self


class StatusAnswer(_Answer):
    job: StatusView

    def status(self) -> StatusView:
        if not self.ok:
            raise AnswerError(self.error_line())
        return self.job


Answer = SummaryAnswer | StatusAnswer


def _unreadable(exc: ValidationError) -> AnswerError:
    return AnswerError(f"the jobs function's answer cannot be read: {one_line(exc)}")


def read_answer(raw: Mapping[str, Any] | str | bytes) -> Answer:
    """The jobs function's answer (its JSON, or that parsed): a status when its job lists attempts, else
    a summary or the list. AnswerError when it cannot be read."""
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise AnswerError(f"the jobs function's answer is not JSON: {exc}") from None
    if not isinstance(raw, Mapping):
        raise AnswerError(f"the jobs function's answer is not a JSON object but {type(raw).__name__}")
    job = raw.get("job")
    status = isinstance(job, Mapping) and isinstance(job.get("attempts"), list)
    try:
        return (StatusAnswer if status else SummaryAnswer).model_validate(raw)
    except ValidationError as exc:
        raise _unreadable(exc) from None


def read_status(raw: StatusView | Mapping[str, Any]) -> StatusView:
    """A status: the whole answer ({"ok": ..., "job": {...}}) or its job alone, as `--plot` and the demos
    are given it. AnswerError when it is none."""
    if isinstance(raw, StatusView):
        return raw
    job = raw.get("job") if isinstance(raw.get("job"), Mapping) else raw
    if not isinstance(job, Mapping) or not isinstance(job.get("attempts"), list):
        raise AnswerError("not a jobs status answer: no job with a list of attempts")
    try:
        return StatusView.model_validate(job)
    except ValidationError as exc:
        raise _unreadable(exc) from None

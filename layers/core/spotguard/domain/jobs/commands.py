"""What the jobs function takes by hand (`sam remote invoke`, the `spotguard jobs` CLI) and what it
answers. Pure pydantic models: the CLI validates with the same ones before it invokes anything."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from spotguard.domain.errors import MAX_DEPTH, one_line, too_deep
from spotguard.domain.jobs.answers import JobStatus, JobSummary
from spotguard.domain.jobs.model import JobState
from spotguard.domain.jobs.submission import JobOptions, RunTaskRequest
from spotguard.domain.tasks import JOB_ID

_JOB_ID = Field(pattern=JOB_ID.pattern, description="a job id")
TASK_ARN = r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/[A-Za-z0-9_-]+/[0-9a-f-]{32,36}$"
MANIFEST_URI = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/(.+/)?checkpoints/\d{1,20}/MANIFEST\.json$"


class Submit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["submit"]
    request: RunTaskRequest
    options: JobOptions = JobOptions()
    job_id: Annotated[str | None, _JOB_ID] = None  # chosen by the caller; a repeat returns the same job

    @model_validator(mode="after")
    def _one_door(self) -> Submit:
        """What the job spec refuses is refused here too (the spec is one door, this the other)."""
        if "rendezvous_port" in self.options.model_fields_set and self.options.nodes < 2:
            raise ValueError("options.rendezvous_port: for a multi-node job (nodes: 2 or more)")
        return self


class Resubmit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["resubmit"]
    job_id: Annotated[str | None, _JOB_ID] = None
    task_arn: str | None = Field(default=None, pattern=TASK_ARN)
    checkpoint: str | None = Field(
        default=None, pattern=MANIFEST_URI, description="the manifest to resume from; default the newest"
    )

    @model_validator(mode="after")
    def _one_target(self) -> Resubmit:
        if (self.job_id is None) == (self.task_arn is None):
            raise ValueError("give exactly one of job_id and task_arn")
        return self


class Cancel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["cancel"]
    job_id: Annotated[str, _JOB_ID]
    reason: str = Field(default="cancelled by the user", max_length=200)


class Status(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["status"]
    job_id: Annotated[str, _JOB_ID]


class ListJobs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["list"]
    state: JobState | None = None
    limit: int = Field(default=50, ge=1, le=500)


Command = Annotated[Submit | Resubmit | Cancel | Status | ListJobs, Field(discriminator="action")]
_COMMAND: TypeAdapter[Submit | Resubmit | Cancel | Status | ListJobs] = TypeAdapter(Command)
ACTIONS = ("submit", "resubmit", "cancel", "status", "list")


class CommandError(ValueError):
    """A manual invocation that cannot be carried out, with its one-line reason."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_command(payload: Any) -> Submit | Resubmit | Cancel | Status | ListJobs:
    if not isinstance(payload, dict):
        raise CommandError("BadRequest", f"the payload must be a JSON object, not a {type(payload).__name__}")
    if too_deep(payload):
        raise CommandError("BadRequest", f"the payload is nested too deeply (more than {MAX_DEPTH} levels)")
    if payload.get("action") not in ACTIONS:
        raise CommandError(
            "BadRequest", f"action: must be one of {', '.join(ACTIONS)} (got {payload.get('action')!r})"
        )
    try:
        return _COMMAND.validate_python(payload)
    except ValidationError as exc:
        raise CommandError("BadRequest", one_line(exc)) from None


class ErrorBody(BaseModel):
    type: str
    message: str


class Answer(BaseModel):
    """The jobs function's answer: ok with a job or jobs, or an error (never a stack trace)."""

    ok: bool
    action: str | None = None
    job: JobStatus | JobSummary | None = None
    jobs: list[JobSummary] | None = None
    error: ErrorBody | None = None

    def wire(self) -> dict[str, Any]:
        """The answer as the function returns it: what is not there is left out at the top, while a job's
        fields that have no value are null (the CLI and users read them so)."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}

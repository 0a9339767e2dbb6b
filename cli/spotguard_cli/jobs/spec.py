"""A job spec: what a user writes about a training job (image, command, GPUs, the checkpoint directory
inside the container, environment, deadline, capacity), turned into the task definition SpotGuard
registers for it and the RunTask request the jobs function is given.

```yaml
name: resnet-imagenet            # the job's id (optional)
cluster: gpu-spot
image: 123456789012.dkr.ecr.us-west-2.amazonaws.com/train:latest
command: python train.py --epochs 90
gpus: 4
checkpoint_dir: /opt/checkpoints # the agent restores into it before the command, commits what is written
environment: {BATCH_SIZE: "256"}
task_role_arn: arn:aws:iam::123456789012:role/spotguard/training-task
execution_role_arn: arn:aws:iam::123456789012:role/spotguard/ecs-task-execution
deadline: 48h                    # or an ISO 8601 time with a zone
work_hours: 20
```

SageMaker's idea for the checkpoint directory: with `checkpoint_dir`, the container's command becomes
`spotguard-agent run --dir DIR -- COMMAND` (the image has the agent: `pip install spotguard-agent`), so
the job needs no change of code: the agent restores the newest checkpoint into DIR before the command
starts, commits what the job writes there, and turns SpotGuard's signals into a commit. Without it the
command runs as given (a job that uses the agent's library itself). Logs go to CloudWatch Logs (awslogs)
unless `logs: false`, so `spotguard jobs logs` finds them. Or name an existing `task_definition` instead
of an image (its command can still be overridden). A raw RunTask request (`--request`) stays for those
who need more.

A multi-node job (`nodes: 2` or more, and `rendezvous_port`) runs the same command on every node; its
registered task definition uses host networking so the nodes reach each other at their instances'
addresses (bridge networking publishes no port).

Every field is checked before anything is registered or invoked; a bad one is said in one line naming it
(`gpus: Input should be less than or equal to 8`).

Registering the task definition with ECS, or finding the one a spec names, is `registration`'s.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from spotguard.domain.errors import MAX_DEPTH, one_line, too_deep
from spotguard.domain.jobs.commands import CommandError
from spotguard.domain.jobs.model import SPOTGUARD_ENV, TORCHRUN_ENV
from spotguard.domain.jobs.submission import MAX_NODES
from spotguard.domain.tasks import JOB_ID, MANAGED_TAG
from spotguard_cli.arguments import checkpoint_directory

LOG_GROUP = "/spotguard/jobs"
CONTAINER = "train"
STOP_TIMEOUT = 120  # ECS's most for a container's SIGTERM -> SIGKILL: the whole spot warning
STOP_BUDGET = "SPOTGUARD_STOP_TIMEOUT_SECONDS"  # what the agent may spend on its stop checkpoint
_DURATION = re.compile(r"^([0-9]{1,5}(?:\.[0-9]+)?)([mhd])$")
_ROLE = r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


class Logs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    group: str = Field(default=LOG_GROUP, min_length=1, max_length=512, pattern=r"^[\w#./-]+$")
    region: str | None = Field(default=None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")


class JobSpec(BaseModel):
    """The fields of a job spec file (YAML or JSON); the same as `spotguard jobs submit` flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str | None = Field(default=None, description="the job's id")
    cluster: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_-]+$")
    image: str | None = Field(default=None, min_length=1, max_length=1024)
    task_definition: str | None = Field(default=None, min_length=1, max_length=2048)
    family: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,255}$")  # of the one registered
    command: list[str] | None = Field(default=None, min_length=1)
    gpus: int = Field(default=1, ge=1, le=8, strict=True)
    nodes: int = Field(default=1, ge=1, le=MAX_NODES, strict=True)  # a multi-node job: one task an instance
    checkpoint_dir: str | None = Field(default=None, max_length=1024)  # normalised: _checkpoint_dir
    environment: dict[str, str] = Field(default_factory=dict)
    cpu: int | None = Field(default=None, ge=128, le=196608, strict=True)  # CPU units (1024 = one vCPU)
    memory: int | None = Field(default=None, ge=128, le=2_000_000, strict=True)  # MiB
    shared_memory: int | None = Field(
        default=None, ge=1, le=2_000_000, strict=True
    )  # MiB of /dev/shm (DataLoader)
    task_role_arn: str | None = Field(default=None, pattern=_ROLE)
    execution_role_arn: str | None = Field(default=None, pattern=_ROLE)
    logs: Logs | Literal[False] = Logs()
    capacity_provider: str | None = Field(default=None, min_length=1, max_length=255)
    subnets: list[str] | None = None
    security_groups: list[str] | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    # the job's options (docs/jobs.md), by the same names
    deadline: AwareDatetime | None = None
    capacity: Literal["auto", "fixed"] | None = None
    work_hours: float | None = Field(default=None, gt=0, le=10000, strict=True)
    max_attempts: int | None = Field(default=None, ge=1, le=100, strict=True)
    max_error_retries: int | None = Field(default=None, ge=0, le=20, strict=True)
    avoid_pool_seconds: int | None = Field(default=None, ge=0, le=7 * 86400, strict=True)
    rendezvous_port: int | None = Field(
        default=None, ge=1024, le=65535, strict=True
    )  # torchrun's master port

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not JOB_ID.fullmatch(v):
            raise ValueError("1-64 letters, digits, - and _, starting with a letter or digit")
        return v

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, v: str | None) -> str | None:
        return None if v is None else checkpoint_directory(v)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, v: Any) -> Any:
        """A duration from now (90m, 48h, 3d) or an ISO 8601 time with a zone."""
        if isinstance(v, str) and (m := _DURATION.match(v.strip())):
            unit = {"m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
            return datetime.now(UTC) + timedelta(**{unit: float(m.group(1))})
        return v

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable's name")
            if key in SPOTGUARD_ENV:
                raise ValueError(f"{key} is set by SpotGuard for each attempt")
        return v

    @model_validator(mode="after")
    def _what_runs(self) -> JobSpec:
        if (self.image is None) == (self.task_definition is None):
            raise ValueError("give image (SpotGuard registers the task definition) or task_definition")
        if self.task_definition is not None:
            made = [
                f
                for f in (
                    "gpus",
                    "logs",
                    "family",
                    "checkpoint_dir",
                    "cpu",
                    "memory",
                    "shared_memory",
                    "task_role_arn",
                    "execution_role_arn",
                )
                if f in self.model_fields_set
            ]
            if made:
                raise ValueError(
                    f"{', '.join(made)}: set in the task definition itself when task_definition is given"
                )
        if self.image is not None and self.command is None:
            raise ValueError("command: required with image (what the container runs)")
        if self.security_groups and not self.subnets:
            raise ValueError("security_groups: needs subnets (awsvpc tasks need both)")
        if self.deadline is not None and self.deadline <= datetime.now(UTC):
            raise ValueError(
                f"deadline: {self.deadline.isoformat()} has passed: give a time to come (or 48h)"
            )
        if self.rendezvous_port is not None and self.nodes < 2:
            raise ValueError("rendezvous_port: for a multi-node job (nodes: 2 or more)")
        torchrun = [k for k in self.environment if k in TORCHRUN_ENV]
        if torchrun and self.nodes > 1:
            raise ValueError(f"environment: {', '.join(torchrun)} set by SpotGuard for each node")
        return self

    @property
    def network_mode(self) -> str:
        """awsvpc with subnets; else bridge, or host for a multi-node job: its nodes reach node 0's
        rendezvous port and each other's (NCCL's) ports at their instances' addresses, which bridge
        networking does not publish."""
        if self.subnets:
            return "awsvpc"
        return "host" if self.nodes > 1 else "bridge"


def load_spec(path: str, overrides: dict[str, Any]) -> JobSpec:
    """The spec in the file at `path` (YAML or JSON), with `overrides` (the flags given) over it; an
    environment given both ways is merged, the flags' values over the file's."""
    fields = _read(path) if path else {}
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(fields.get("environment"), dict) and isinstance(given.get("environment"), dict):
        given["environment"] = {**fields["environment"], **given["environment"]}
    fields.update(given)
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        raise CommandError("BadRequest", f"{where}{one_line(exc)}") from None


MAX_SPEC_BYTES = 1 << 20  # a spec is a few KB: a larger file is refused before it is read whole


def _read(path: str) -> dict[str, Any]:
    """The spec file's fields; CommandError in one line for a file that is too large, not UTF-8, not
    valid YAML or JSON, nested absurdly deep, or not a mapping."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise CommandError("BadRequest", f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise CommandError("BadRequest", f"{path}: larger than {MAX_SPEC_BYTES // 1024} KiB: not a job spec")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
        raise CommandError("BadRequest", f"{path}: not UTF-8 text ({where}): save it as UTF-8") from None
    kind = "JSON" if path.endswith(".json") else "YAML"
    import yaml

    try:
        data = json.loads(text) if kind == "JSON" else yaml.load(text, Loader=_no_aliases_loader())
    except (ValueError, yaml.YAMLError) as exc:
        raise CommandError("BadRequest", f"{path}: not valid {kind}: {first_line(exc)}") from None
    except RecursionError:
        raise CommandError("BadRequest", f"{path}: nested deeper than a job spec can be") from None
    if too_deep(data):
        raise CommandError("BadRequest", f"{path}: nested deeper than {MAX_DEPTH} levels: not a job spec")
    if not isinstance(data, dict):
        raise CommandError("BadRequest", f"{path}: a job spec is a mapping of fields (name: value)")
    return data


def _no_aliases_loader() -> Any:
    """yaml's SafeLoader without aliases (`*name`): a spec has no use for them, and a few nested ones
    make a file of a few KB stand for billions of values."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not accepted in a job spec", event.start_mark
                )
            return super().compose_node(parent, index)

    return NoAliases


def first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


# ---------------------------------------------------------------------------------------------- output
def family(spec: JobSpec) -> str:
    """The task definition's family: the spec's, else one per image and GPU count (jobs of the same spec
    share its revisions, whatever their names), and network mode: a multi-node job's host networking
    is its own family, so one-node and multi-node jobs of one image do not make each other's revisions
    by turns."""
    if spec.family:
        return spec.family
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", (spec.image or "job").rsplit("/", 1)[-1]).strip("-")
    host = "-host" if spec.network_mode == "host" else ""
    return f"spotguard-{base}-{spec.gpus}gpu{host}"[:255]


def command_of(spec: JobSpec) -> list[str] | None:
    """The container's command: wrapped by the agent when the job names a checkpoint directory."""
    if spec.command is None:
        return None
    if spec.checkpoint_dir:
        return ["spotguard-agent", "run", "--dir", spec.checkpoint_dir, "--", *spec.command]
    return list(spec.command)


def task_definition(spec: JobSpec, region: str) -> dict[str, Any] | None:
    """The RegisterTaskDefinition request for the spec (None: it names an existing task definition)."""
    if spec.image is None:
        return None
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "essential": True,
        "command": command_of(spec),
        "cpu": spec.cpu or 4096 * spec.gpus,
        "memory": spec.memory or 15000 * spec.gpus,
        "stopTimeout": STOP_TIMEOUT,
        "resourceRequirements": [{"type": "GPU", "value": str(spec.gpus)}],
        # the agent's stop budget is the container's stop timeout (a spec may say less)
        "environment": [
            {"name": k, "value": v}
            for k, v in sorted({STOP_BUDGET: str(STOP_TIMEOUT), **spec.environment}.items())
        ],
        "linuxParameters": {"sharedMemorySize": spec.shared_memory or 8192 * spec.gpus},
    }
    if spec.logs is not False:
        container["logConfiguration"] = {
            "logDriver": "awslogs",
            "options": {
                "awslogs-group": spec.logs.group,
                "awslogs-region": spec.logs.region or region,
                "awslogs-stream-prefix": family(spec).removeprefix("spotguard-"),
                "awslogs-create-group": "true",
            },
        }
    td: dict[str, Any] = {
        "family": family(spec),
        "requiresCompatibilities": ["EC2"],
        "networkMode": spec.network_mode,
        "containerDefinitions": [container],
        "tags": [{"key": MANAGED_TAG, "value": "true"}],
    }
    if spec.task_role_arn:
        td["taskRoleArn"] = spec.task_role_arn
    if spec.execution_role_arn:
        td["executionRoleArn"] = spec.execution_role_arn
    return td


def run_task_request(spec: JobSpec, task_definition_arn: str, container: str = CONTAINER) -> dict[str, Any]:
    """The RunTask request the jobs function is given (`container`: the task definition's first, whose
    command a spec naming an existing task definition may override)."""
    request: dict[str, Any] = {"cluster": spec.cluster, "taskDefinition": task_definition_arn}
    if spec.capacity_provider:
        request["capacityProviderStrategy"] = [{"capacityProvider": spec.capacity_provider}]
    if spec.subnets:
        vpc: dict[str, Any] = {"subnets": spec.subnets, "assignPublicIp": "DISABLED"}
        if spec.security_groups:
            vpc["securityGroups"] = spec.security_groups
        request["networkConfiguration"] = {"awsvpcConfiguration": vpc}
    if spec.task_definition and (spec.command or spec.environment):
        override: dict[str, Any] = {"name": container}
        if spec.command:
            override["command"] = list(spec.command)
        if spec.environment:
            override["environment"] = [{"name": k, "value": v} for k, v in sorted(spec.environment.items())]
        request["overrides"] = {"containerOverrides": [override]}
    if spec.tags:
        request["tags"] = [{"key": k, "value": v} for k, v in sorted(spec.tags.items())]
    return request


def options_of(spec: JobSpec) -> dict[str, Any]:
    fields = (
        "capacity",
        "work_hours",
        "max_attempts",
        "max_error_retries",
        "avoid_pool_seconds",
        "rendezvous_port",
    )
    out = {f: getattr(spec, f) for f in fields if getattr(spec, f) is not None}
    if spec.nodes > 1:  # one node is every job's default: a one-node spec's payload is as it was
        out["nodes"] = spec.nodes
    if spec.deadline is not None:
        out["deadline"] = spec.deadline.isoformat()
    return out


def spec_payload(spec: JobSpec, task_definition_arn: str, container: str = CONTAINER) -> dict[str, Any]:
    """The jobs function's submit payload for the spec, its task definition registered."""
    body: dict[str, Any] = {
        "action": "submit",
        "request": run_task_request(spec, task_definition_arn, container),
    }
    if options := options_of(spec):
        body["options"] = options
    if spec.name:
        body["job_id"] = spec.name
    return body

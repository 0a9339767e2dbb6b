"""The stack's configuration, read once per cold start from the function's environment and validated."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotguard.domain.errors import one_line
from spotguard.domain.settings import RebalanceMode, Settings
from spotguard.domain.tasks import ManageMode

# The stack's region and account (template.yaml sets them from AWS::Region and AWS::AccountId); empty in
# tests that do not pin them.
_REGION = r"^([a-z]{2}(-[a-z]+)+-\d+)?$"
_ACCOUNT = r"^(\d{12})?$"


class ConfigError(RuntimeError):
    """The function's environment is wrong: a deployment mistake, reported in one line."""


class EnvModel(BaseModel):
    """A function's SPOTGUARD_* environment, validated once at cold start. Each model is built when it is
    first used: a function builds its own, not the other functions' (a cold start's time)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> Self:
        env = dict(os.environ if environ is None else environ)
        try:
            return cls.model_validate({k: v for k, v in env.items() if k.startswith("SPOTGUARD_")})
        except ValidationError as exc:
            raise ConfigError(f"bad environment: {one_line(exc)}") from None


class InterruptionEnv(EnvModel):
    clusters: tuple[str, ...] = Field(alias="SPOTGUARD_CLUSTERS")
    rebalance: RebalanceMode = Field(default=RebalanceMode.CHECKPOINT, alias="SPOTGUARD_REBALANCE")
    manage: ManageMode = Field(default=ManageMode.TAGGED, alias="SPOTGUARD_MANAGE")
    ledger_table: str = Field(alias="SPOTGUARD_LEDGER_TABLE", min_length=3)
    # no idempotency table: the ledger makes a notice's handling safe to repeat (runtime/interruption.py)
    queue_url: str = Field(alias="SPOTGUARD_INTERRUPTIONS_QUEUE_URL", min_length=1)
    dead_letter_url: str = Field(alias="SPOTGUARD_INTERRUPTIONS_DLQ_URL", min_length=1)
    signal_document: str = Field(alias="SPOTGUARD_SIGNAL_DOCUMENT", min_length=3)  # SpotGuard's SSM document
    lifecycle_hook_prefix: str = Field(
        default="spotguard-", alias="SPOTGUARD_LIFECYCLE_HOOK_PREFIX", pattern=r"^[A-Za-z0-9_./-]{0,200}$"
    )
    lifecycle_wait_seconds: int = Field(default=900, alias="SPOTGUARD_LIFECYCLE_WAIT_SECONDS", ge=0, le=7200)
    lifecycle_check_seconds: int = Field(default=20, alias="SPOTGUARD_LIFECYCLE_CHECK_SECONDS", ge=0, le=900)

    region: str = Field(default="", alias="SPOTGUARD_REGION", pattern=_REGION)
    account: str = Field(default="", alias="SPOTGUARD_ACCOUNT", pattern=_ACCOUNT)

    _split = field_validator("clusters", mode="before")(lambda cls, v: _comma_list(v))

    @property
    def settings(self) -> Settings:
        return Settings(
            clusters=self.clusters,
            rebalance=self.rebalance,
            lifecycle_hook_prefix=self.lifecycle_hook_prefix,
            region=self.region,
            account=self.account,
        )


def _comma_list(v: object) -> object:
    if isinstance(v, str):
        return tuple(c.strip() for c in v.split(",") if c.strip())
    return v


class CheckpointsEnv(EnvModel):
    ledger_table: str = Field(alias="SPOTGUARD_LEDGER_TABLE", min_length=3)
    dead_letter_url: str = Field(alias="SPOTGUARD_CHECKPOINTS_DLQ_URL", min_length=1)


class JobsEnv(EnvModel):
    """The jobs function and the task-events function: both run the job use case."""

    clusters: tuple[str, ...] = Field(alias="SPOTGUARD_CLUSTERS")
    manage: ManageMode = Field(default=ManageMode.TAGGED, alias="SPOTGUARD_MANAGE")
    ledger_table: str = Field(alias="SPOTGUARD_LEDGER_TABLE", min_length=3)
    idempotency_table: str = Field(alias="SPOTGUARD_IDEMPOTENCY_TABLE", min_length=3)
    checkpoint_bucket: str = Field(alias="SPOTGUARD_CHECKPOINT_BUCKET", min_length=3)
    topic_arn: str = Field(default="", alias="SPOTGUARD_TOPIC_ARN")
    retry_queue_url: str = Field(alias="SPOTGUARD_RETRY_QUEUE_URL", min_length=1)
    dead_letter_url: str = Field(default="", alias="SPOTGUARD_TASK_EVENTS_DLQ_URL")
    default_subnets: tuple[str, ...] = Field(default=(), alias="SPOTGUARD_DEFAULT_SUBNETS")
    default_security_groups: tuple[str, ...] = Field(default=(), alias="SPOTGUARD_DEFAULT_SECURITY_GROUPS")
    # Not a stack parameter: the local stack and tests shorten the wait for capacity.
    retry_base_seconds: int = Field(default=30, alias="SPOTGUARD_RETRY_BASE_SECONDS", ge=1, le=900)
    ebs_role_arn: str | None = Field(default=None, alias="SPOTGUARD_EBS_ROLE_ARN")
    # The roles the stack may pass to ECS (ARN patterns, `*` a wildcard) and the task definition
    # families it may run (the TaskRoleArns and TaskDefinitionFamilies parameters); empty: no check.
    pass_roles: tuple[str, ...] = Field(default=(), alias="SPOTGUARD_PASS_ROLES")
    task_families: tuple[str, ...] = Field(default=(), alias="SPOTGUARD_TASK_FAMILIES")
    # SpotGuard's SSM document: a move asks the job's checkpoint container to commit through it.
    signal_document: str = Field(default="", alias="SPOTGUARD_SIGNAL_DOCUMENT")
    region: str = Field(default="", alias="SPOTGUARD_REGION", pattern=_REGION)
    account: str = Field(default="", alias="SPOTGUARD_ACCOUNT", pattern=_ACCOUNT)
    # The Auto Scaling groups the early replacement may add a spare instance to (SpareCapacityGroups);
    # empty: it is off.
    spare_groups: tuple[str, ...] = Field(default=(), alias="SPOTGUARD_SPARE_GROUPS")
    # Whose terminate actions are SpotGuard's (LifecycleHookPrefix): the early replacement reads them.
    lifecycle_hook_prefix: str = Field(
        default="spotguard-", alias="SPOTGUARD_LIFECYCLE_HOOK_PREFIX", pattern=r"^[A-Za-z0-9_./-]{0,200}$"
    )

    _split = field_validator(
        "clusters",
        "default_subnets",
        "default_security_groups",
        "pass_roles",
        "task_families",
        "spare_groups",
        mode="before",
    )(lambda cls, v: _comma_list(v))

    @property
    def settings(self) -> Settings:
        return Settings(
            clusters=self.clusters,
            region=self.region,
            account=self.account,
            lifecycle_hook_prefix=self.lifecycle_hook_prefix,
        )

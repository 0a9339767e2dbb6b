"""The stack's configuration, read once per cold start from the function's environment and validated."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotguard.domain.notices import RebalanceMode, Settings
from spotguard.domain.tasks import ManageMode


class ConfigError(RuntimeError):
    """The function's environment is wrong: a deployment mistake, reported in one line."""


class InterruptionEnv(BaseModel):
    model_config = ConfigDict(frozen=True)
    clusters: tuple[str, ...] = Field(alias="SPOTGUARD_CLUSTERS")
    rebalance: RebalanceMode = Field(default=RebalanceMode.CHECKPOINT, alias="SPOTGUARD_REBALANCE")
    manage: ManageMode = Field(default=ManageMode.TAGGED, alias="SPOTGUARD_MANAGE")
    ledger_table: str = Field(alias="SPOTGUARD_LEDGER_TABLE", min_length=3)
    idempotency_table: str = Field(alias="SPOTGUARD_IDEMPOTENCY_TABLE", min_length=3)
    queue_url: str = Field(alias="SPOTGUARD_INTERRUPTIONS_QUEUE_URL", min_length=1)
    dead_letter_url: str = Field(alias="SPOTGUARD_INTERRUPTIONS_DLQ_URL", min_length=1)
    lifecycle_wait_seconds: int = Field(default=900, alias="SPOTGUARD_LIFECYCLE_WAIT_SECONDS", ge=0, le=7200)
    lifecycle_check_seconds: int = Field(default=20, alias="SPOTGUARD_LIFECYCLE_CHECK_SECONDS", ge=0, le=900)

    @field_validator("clusters", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(c.strip() for c in v.split(",") if c.strip())
        return v

    @property
    def settings(self) -> Settings:
        return Settings(clusters=self.clusters, rebalance=self.rebalance)

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> InterruptionEnv:
        env = dict(os.environ if environ is None else environ)
        try:
            return cls.model_validate({k: v for k, v in env.items() if k.startswith("SPOTGUARD_")})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigError(f"bad environment: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None

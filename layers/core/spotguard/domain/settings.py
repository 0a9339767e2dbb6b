"""The part of the stack's configuration that changes what an event means: the watched clusters (pinned
to the stack's region and account), what a rebalance recommendation does, and which lifecycle hooks are
SpotGuard's. Pure."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class RebalanceMode(StrEnum):
    IGNORE = "ignore"
    CHECKPOINT = "checkpoint"  # SIGUSR1 to managed tasks: checkpoint and keep running
    DRAIN = "drain"  # treat it as an interruption: drain the host, stop tasks with a checkpoint


class Settings(BaseModel):
    """The part of the stack's configuration that changes what an event means."""

    model_config = ConfigDict(frozen=True)
    clusters: tuple[str, ...] = ()  # names; empty = every cluster
    rebalance: RebalanceMode = RebalanceMode.CHECKPOINT
    # Terminate lifecycle hooks SpotGuard answers: those whose name starts with this (empty = every
    # hook). Others (ECS managed draining's, other teams') are left to their owners.
    lifecycle_hook_prefix: str = "spotguard-"
    # The stack's region and account (empty: not pinned). Clusters are listed by name, so without these
    # a cluster of the same name in another region or account would pass for a watched one.
    region: str = ""
    account: str = ""

    def elsewhere(self, arn: str) -> str | None:
        """Why an ARN names something outside the stack's region or account; None for a plain name, or
        an ARN in the stack's own region and account."""
        if not arn.startswith("arn:"):
            return None
        parts = arn.split(":", 5)
        if len(parts) < 6:
            return f"{arn} is not a valid ARN"
        region, account = parts[3], parts[4]
        if self.region and region != self.region:
            return f"{arn} is in region {region or '(none)'}, not the stack's {self.region}"
        if self.account and account != self.account:
            return f"{arn} is in account {account or '(none)'}, not the stack's {self.account}"
        return None

    def watches(self, cluster: str) -> bool:
        """A cluster (name or ARN) SpotGuard may act in: listed (or every one when none is), and, for an
        ARN, in the stack's region and account."""
        if self.elsewhere(cluster) is not None:
            return False
        if not self.clusters:
            return True
        name = cluster.rsplit("/", 1)[-1]
        return name in self.clusters or cluster in self.clusters

"""spotguard-agent: the container side of SpotGuard (restore the newest committed checkpoint, commit new
ones). See docs/container-contract.md for the contracts: the SPOTGUARD_* environment, the checkpoint
layout, exit codes."""

from spotguard_agent.agent import RESUME_ME, Agent, AgentEnv, NotUnderSpotGuard, RestoreFailed
from spotguard_agent.manifest import Manifest
from spotguard_agent.store import CheckpointStore, Committed
from spotguard_agent.store_errors import CheckpointDamaged, CheckpointUnavailable, StoreError

__all__ = [
    "RESUME_ME",
    "Agent",
    "AgentEnv",
    "CheckpointDamaged",
    "CheckpointStore",
    "CheckpointUnavailable",
    "Committed",
    "Manifest",
    "NotUnderSpotGuard",
    "RestoreFailed",
    "StoreError",
]

"""PyTorch helpers: save a training state (state dicts, tensors, RNG states, plain values) as a
checkpoint, and load it back. Imported only by jobs that use torch."""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from spotguard_agent.agent import Agent

STATE_FILE = "state.pt"


def _snapshot(value: Any) -> Any:
    """A copy in CPU memory, so training can go on changing the originals while the copy is written."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    return copy.deepcopy(value)


def save(agent: Agent, step: int, progress: float, state: dict[str, Any], sync: bool = False) -> None:
    """Checkpoint `state`. Async (the default): the copy is taken now, written and uploaded in the
    background. Sync: all of it before returning (for small states). After SIGTERM always at once."""
    started = time.monotonic()
    snapshot = _snapshot(state)
    directory = Path(tempfile.mkdtemp(prefix="spotguard-ckpt-"))

    def write() -> None:
        torch.save(snapshot, directory / STATE_FILE)

    if sync:
        try:
            write()
            agent.commit(directory, step, progress)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    else:
        agent.commit_async(directory, step, progress, prepare=write)
    agent.note_cost(time.monotonic() - started)


def load(directory: Path) -> dict[str, Any]:
    """The state saved by `save`, from a restored checkpoint directory."""
    return dict(torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=False))

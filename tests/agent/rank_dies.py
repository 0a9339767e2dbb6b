"""examples/train_ddp.py with one rank that dies (SIGKILL) in the middle of a commit: once its files of
checkpoint DIE_AT_SEQUENCE are written, before they are reported and the manifest is written. For
tests/agent/test_torchrun.py, run by torchrun in place of the example."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from spotguard_agent.store import CheckpointStore, Parts

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"

if os.environ.get("RANK") == os.environ.get("DIE_RANK", "1"):
    parts, die_at = CheckpointStore.parts, int(os.environ["DIE_AT_SEQUENCE"])

    @contextlib.contextmanager
    def parts_or_die(self: CheckpointStore, sequence: int) -> Iterator[Parts]:
        with parts(self, sequence) as target:
            yield target  # this rank's files are written here
            if sequence >= die_at:
                os.kill(os.getpid(), signal.SIGKILL)

    CheckpointStore.parts = parts_or_die  # type: ignore[method-assign]

sys.path.insert(0, str(EXAMPLE.parent))
sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")

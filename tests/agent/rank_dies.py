"""examples/train_ddp.py with one rank (DIE_RANK, default 1) that fails in the middle of checkpoint
DIE_AT_SEQUENCE: DIE_HOW=kill (the default) SIGKILLs it once its files are written, before they are
reported and the manifest is written; DIE_HOW=disk-full makes its file writes fail (ENOSPC). For
tests/agent/test_torchrun.py, run by torchrun in place of the example."""

from __future__ import annotations

import contextlib
import errno
import os
import runpy
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spotguard_agent.store import CheckpointStore, Parts
from spotguard_agent.torch_state import _HashingRaw

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"

if os.environ.get("RANK") == os.environ.get("DIE_RANK", "1"):
    parts, die_at = CheckpointStore.parts, int(os.environ["DIE_AT_SEQUENCE"])
    how = os.environ.get("DIE_HOW", "kill")
    disk_full = threading.Event()
    write = _HashingRaw.write

    def write_or_fail(self: _HashingRaw, b: Any) -> int:
        if disk_full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, b)

    @contextlib.contextmanager
    def parts_or_die(self: CheckpointStore, sequence: int) -> Iterator[Parts]:
        if how == "disk-full" and sequence >= die_at:
            disk_full.set()
        with parts(self, sequence) as target:
            yield target  # this rank's files are written here
            if how == "kill" and sequence >= die_at:
                os.kill(os.getpid(), signal.SIGKILL)

    CheckpointStore.parts = parts_or_die  # type: ignore[method-assign]
    _HashingRaw.write = write_or_fail  # type: ignore[method-assign]

sys.path.insert(0, str(EXAMPLE.parent))
sys.argv = [str(EXAMPLE), *sys.argv[1:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")

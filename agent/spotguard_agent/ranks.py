"""The agent in a job of several processes (torchrun: one process a GPU), and what ties them together.

- `Ranks`: who this process is (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, as torchrun sets them).
- `Collective`: the agent's own two gloo process groups, made once the job has initialised
  torch.distributed: one for the decision taken at every step boundary (one small all_reduce MAX), one
  for a checkpoint's commit (the DCP save, the file lists, the manifest), which may run in a background
  thread while the training goes on. Gloo, whatever the job's backend: the agent's messages are on the
  CPU and never wait on a CUDA stream, and never share a communicator with the training's collectives.
- `ControlDir`: the way `spotguard-agent run -- torchrun ...` reaches every rank. ECS signals only the
  container's first process; torchrun turns SIGTERM into a shutdown of its workers (killed
  --shutdown-timeout later) and does not pass SIGUSR1 on at all. So the wrapper, as the first process,
  keeps the signals and writes them as files in a directory it names in SPOTGUARD_CONTROL_DIR; every rank
  reads it at each step boundary (one stat and, rarely, a read), and once the stop checkpoint is
  committed each machine's first local rank writes the outcome there for its wrapper to exit 75 (a job
  of several nodes has a wrapper, and a control directory, per node).

Nothing here imports torch until a Collective is made: the agent works without torch in one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTROL_DIR_ENV = "SPOTGUARD_CONTROL_DIR"
STOP_FILE = "stop"
CHECKPOINT_FILE = "checkpoint"
OUTCOME_FILE = "outcome"
STARTED_FILE = "started"  # a process has made its agent: a stop will be answered at a step boundary


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Ranks:
        env = os.environ if environ is None else environ

        def number(name: str, default: int) -> int:
            value = env.get(name, "").strip()
            try:
                return int(value) if value else default
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a whole number") from None

        world = number("WORLD_SIZE", 1)
        if not env.get("WORLD_SIZE", "").strip():
            return cls(0, 1, 0, 1)  # no launcher's world (a stray RANK alone): one process, as before
        rank = number("RANK", 0)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK={rank} and WORLD_SIZE={world} do not fit together")
        local_world = number("LOCAL_WORLD_SIZE", world)
        return cls(rank, world, number("LOCAL_RANK", rank), local_world)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def leader(self) -> bool:
        """The rank that writes manifests, applies retention and reports the outcome (rank 0)."""
        return self.rank == 0


class Collective:
    """The agent's process groups (see the module's doc). Every rank must make it at the same point of
    its program (the agent does so at its first restore or should_save, which every rank calls)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "WORLD_SIZE > 1: initialise torch.distributed (dist.init_process_group) before the agent's "
                "restore, should_save or save"
            )
        self.dist = dist
        self.flags = dist.new_group(backend="gloo")  # the step boundary's decision (the loop's thread)
        self.commit = dist.new_group(backend="gloo")  # a checkpoint's commit (perhaps a background thread)

    def max(self, values: list[float]) -> list[float]:
        """Every rank's `values`, element by element the largest (one all_reduce)."""
        import torch

        t = torch.tensor(values, dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.flags)
        return [float(v) for v in t.tolist()]

    def gather(self, obj: Any, commit: bool = True) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        out: list[Any] = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(out, obj, group=self.commit if commit else self.flags)
        return out

    def broadcast(self, obj: Any, commit: bool = True) -> Any:
        """Rank 0's `obj` on every rank."""
        box = [obj]
        self.dist.broadcast_object_list(box, src=0, group=self.commit if commit else self.flags)
        return box[0]


class ControlDir:
    """Requests from the wrapper (stop, checkpoint) and the outcome back to it, as small files written
    whole (a temporary name, then a rename) in one directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen_checkpoints = self._checkpoints()  # requests made before this process started are old

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ControlDir | None:
        value = (os.environ if environ is None else environ).get(CONTROL_DIR_ENV, "")
        return cls(Path(value)) if value else None

    # ---------------------------------------------------------------------------------- the wrapper
    def request_stop(self, deadline: float | None, why: str) -> None:
        """Stop: checkpoint at the next step boundary and exit; `deadline`: Unix time the commit must
        be done by (None: the agent's own stop budget from when it reads this)."""
        self._write(STOP_FILE, {"deadline": deadline, "why": why})

    def request_checkpoint(self, why: str) -> None:
        with self._lock:
            count = self._checkpoints() + 1
            self._write(CHECKPOINT_FILE, {"count": count, "why": why})

    def outcome(self) -> dict[str, Any] | None:
        return self._read(OUTCOME_FILE)

    def started(self) -> bool:
        """Whether any process has made its agent (`announce`). Until then nothing would answer a stop
        request: no step boundary will read it, and there is nothing of this run to checkpoint."""
        return (self.path / STARTED_FILE).exists()

    # ------------------------------------------------------------------------------------ the ranks
    def announce(self, rank: int) -> None:
        """This process uses the agent: from now on the wrapper's stop requests are answered."""
        self._write(STARTED_FILE, {"rank": rank, "pid": os.getpid()})

    def stop_request(self) -> dict[str, Any] | None:
        return self._read(STOP_FILE)

    def new_checkpoint_request(self) -> bool:
        """True once per checkpoint request made since the last call (or since this process started)."""
        count = self._checkpoints()
        if count > self._seen_checkpoints:
            self._seen_checkpoints = count
            return True
        return False

    def consume_checkpoint_requests(self) -> None:
        """Every checkpoint request made so far is answered, by the checkpoint every rank agreed on at
        this step boundary: a rank that had not read the request yet (it came between two ranks' reads)
        must not take it for a new one at its next boundary, or the job checkpoints twice."""
        self._seen_checkpoints = max(self._seen_checkpoints, self._checkpoints())

    def write_outcome(self, exit_code: int, sequence: int | None, step: int | None, why: str) -> None:
        self._write(OUTCOME_FILE, {"exit": exit_code, "sequence": sequence, "step": step, "why": why})

    # ---------------------------------------------------------------------------------------- files
    def _checkpoints(self) -> int:
        found = self._read(CHECKPOINT_FILE)
        try:
            return int(found["count"]) if found else 0
        except (KeyError, TypeError, ValueError):
            return 0

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            value = json.loads((self.path / name).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _write(self, name: str, value: dict[str, Any]) -> None:
        tmp = self.path / f".{name}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(json.dumps(value))
        try:
            os.replace(tmp, self.path / name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

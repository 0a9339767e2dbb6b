"""PyTorch helpers: save a training state (state dicts, tensors, DTensors, RNG states, plain values) as a
checkpoint, and load it back. Imported only by jobs that use torch.

    save(agent, step, progress, {"model": model.state_dict(), "optimizer": opt.state_dict(), ...})
    state = load(directory)                 # the whole state, plain tensors on the CPU
    state = load(directory, into=template)  # tensors loaded in place into `template`'s (DTensor shards:
                                            # each rank reads its own part, on any world size)

A save copies the state's tensors into host buffers made once and reused (pinned, non-blocking, one
synchronize on a GPU machine: spotguard_agent.snapshot) and returns; the files are written, hashed as
they are written, fsynced and uploaded in the background (after SIGTERM at once) through
torch.distributed.checkpoint (DCP) with several writer threads. In a job of several ranks every rank
calls it at the same step: DCP writes tensors replicated on every rank once and each DTensor shard by
its owner, and the agent commits one manifest of every rank's files. In a file:// store the files are
written straight into the checkpoint's directory; to S3 each is streamed up as it is written, with no
copy through a local disk (store.CheckpointStore.parts).

What is kept: every tensor, under the path of keys that leads to it; the state's other values (numbers,
strings, the optimizer's param_groups, the structure itself with its key types) as this rank's
`skeleton`. A tensor under the same path in every rank is taken to be replicated (written once, from
one rank): keep per-rank tensors (a CPU RNG state that differs by rank) under a path of their own rank,
e.g. {"rng": {rank: torch.get_rng_state()}}.

Checkpoints written by earlier agents (one `state.pt`) load as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from spotguard_agent.agent import Agent
from spotguard_agent.dcp_files import HashingFileSystem, _CheckedWriter, _HashingRaw
from spotguard_agent.manifest import FileEntry, Manifest
from spotguard_agent.snapshot import HostBuffers
from spotguard_agent.store import Parts
from spotguard_agent.store_errors import OtherRankFailed

STATE_FILE = "state.pt"  # the earlier single-file format, still loaded
METADATA = ".metadata"  # DCP's
TENSOR = "t:"  # DCP keys: t:<path of the tensor in the state>
SKELETON = "skeleton:"  # skeleton:<rank>: the state's structure and values that are not tensors
SEP = "/"
__all__ = ["HashingFileSystem", "_HashingRaw", "load", "restore", "save"]
STREAMED = "streamed"  # DCP's path for a checkpoint whose files are streamed up (only their names count)
MAX_FILE_BYTES = 64 * 1024**3  # a streamed file goes up in 16 MiB parts, at most 10,000 (156 GiB)
# DCP says this whenever it runs without a process group, which is how one process saves and loads here
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


class _Ref:
    """Where a tensor was in the state: the key of its DCP entry."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Ref, (self.key,))


def _split(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(the state with each tensor replaced by a _Ref, the tensors by key)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            key = TENSOR + SEP.join(path)
            if key in tensors:
                raise ValueError(f"two tensors of the state have the same path {SEP.join(path)!r}")
            tensors[key] = value
            return _Ref(key)
        if isinstance(value, dict):
            return type(value)((k, walk(v, (*path, str(k)))) for k, v in value.items())
        if isinstance(value, list):
            return [walk(v, (*path, str(i))) for i, v in enumerate(value)]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(walk(v, (*path, str(i))) for i, v in enumerate(value))
        return value

    return walk(state, ()), tensors


def _fill(skeleton: Any, tensors: dict[str, Any]) -> Any:
    if isinstance(skeleton, _Ref):
        return tensors[skeleton.key]
    if isinstance(skeleton, dict):
        return type(skeleton)((k, _fill(v, tensors)) for k, v in skeleton.items())
    if isinstance(skeleton, list):
        return [_fill(v, tensors) for v in skeleton]
    if isinstance(skeleton, tuple) and not hasattr(skeleton, "_fields"):
        return tuple(_fill(v, tensors) for v in skeleton)
    return skeleton


def _as_tensor(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)


def _as_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel()) if t.numel() else b""


# ------------------------------------------------------------------------------------------- save
def save(agent: Agent, step: int, progress: float, state: dict[str, Any], sync: bool = False) -> None:
    """Checkpoint `state`. Async (the default): the copy is taken now, written and uploaded in the
    background. Sync: all of it before returning (for small states). After SIGTERM always at once. In a
    job of several ranks, every rank calls it at the same step (when should_save said so)."""
    started = time.monotonic()
    agent.wait()  # the host buffers are reused: the previous checkpoint must be written first
    if agent.host_buffers is None:
        agent.host_buffers = HostBuffers()
    buffers: HostBuffers = agent.host_buffers
    skeleton, tensors = _split(buffers.take(state))
    agent.snapshot_seconds = buffers.last_seconds
    blob = pickle.dumps(skeleton)
    payload: dict[str, Any] = {**tensors, f"{SKELETON}{agent.ranks.rank}": _as_tensor(blob)}
    skeleton_sha256 = hashlib.sha256(blob).hexdigest()  # in this rank's blocks file, for restore
    # enough files that none is over MAX_FILE_BYTES (S3 takes at most 10,000 parts of a file)
    threads = max(_threads(agent), -(-buffers.bytes // MAX_FILE_BYTES))

    def write(parts: Parts, group: Any) -> list[FileEntry]:
        import torch.distributed.checkpoint as dcp

        fs = HashingFileSystem(parts.open)
        writer = _CheckedWriter(
            parts.directory or STREAMED,
            thread_count=threads,
            sync_files=parts.directory is not None,  # a streamed file is durable when its upload ends
            overwrite=True,
        )
        writer.fs = fs
        try:
            dcp.save(payload, storage_writer=writer, process_group=group, no_dist=group is None)
        except CheckpointException as exc:  # a BaseException whose text is every rank's traceback
            raise _first_failure(exc, agent.ranks.rank) from None
        return fs.entries(agent.ranks.rank, skeleton_sha256=skeleton_sha256)

    agent.commit_parts(write, step, progress, sync=sync)
    agent.note_cost(time.monotonic() - started)


def _first_failure(exc: CheckpointException, rank: int) -> BaseException:
    """What to raise for DCP's CheckpointException, which every rank gets alike: this rank's own error
    when it failed (one line, as it raised it; an interrupt stays one), else OtherRankFailed naming the
    lowest rank that failed and its error."""
    failed = sorted(exc.failures)
    if not failed:
        return RuntimeError("the checkpoint was not written")
    chosen = rank if rank in exc.failures else failed[0]
    error = exc.failures[chosen][0]
    if chosen == rank or not isinstance(error, Exception):
        return error
    return OtherRankFailed(f"rank {chosen}: {type(error).__name__}: {error}")


def _threads(agent: Agent) -> int:
    if agent.env.write_threads:
        return agent.env.write_threads
    cores = os.cpu_count() or 1
    return max(1, min(8, cores // max(1, agent.ranks.local_world)))


# ------------------------------------------------------------------------------------------- load
def restore(agent: Agent, into: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The newest committed checkpoint's state (as `load` gives it), read straight from the store into
    memory: no local copy and no disk, each rank reading only what it loads (with `into`: its own part of
    each DTensor, or the overlapping parts when the world size changed; without: every tensor, whole),
    each block verified as it arrives. None for a fresh start. The checkpoint is chosen, and a damaged one
    passed over, as `Agent.restore` does; it raises RestoreFailed as that does. What this rank read:
    `agent.restore_counts` (dcp_reader.ReadCounts). A checkpoint of an earlier agent's DCP files without
    blocks is read the same way, each file this rank needs whole (checked against its sha256); one of the
    earliest agents' (one state.pt) is downloaded into a temporary directory and loaded from there."""
    from spotguard_agent.dcp_reader import StoreReader

    def prepare(manifest: Manifest) -> Any:
        """This rank alone: what can fail in one rank (DCP's metadata read, an old state.pt downloaded)."""
        if not any(e.path == METADATA for e in manifest.files):  # the earliest agents' one state.pt
            tmp = tempfile.TemporaryDirectory(prefix="spotguard-restore-")
            agent.store.download_verified(manifest, Path(tmp.name) / "checkpoint")
            return tmp
        reader = StoreReader(agent.store, manifest, concurrency=agent.store.transfer.max_concurrency)
        reader.read_metadata()  # kept: every later read of it in `_load_with` is from memory
        return reader

    def read(prepared: Any) -> dict[str, Any]:
        if isinstance(prepared, tempfile.TemporaryDirectory):
            with prepared as tmp:
                return load(Path(tmp) / "checkpoint", into=into)
        agent.restore_counts = prepared.counts
        return _load_with(lambda: prepared, into)

    found = agent.restore_state(read, prepare)
    return None if found is None else found[1]


def load(directory: Path, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state saved by `save`, from a restored checkpoint directory. Without `into`: every value,
    tensors whole on the CPU (in any number of processes). With `into` (a state of the same structure,
    such as the model's and optimizer's state dicts under FSDP): its tensors are loaded in place, each
    rank reading its own part of a DTensor (resharded when the checkpoint was written by another number
    of ranks), a collective call in every rank; the state returned holds them."""
    directory = Path(directory)
    if (directory / STATE_FILE).exists():
        return dict(torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False))
    import torch.distributed.checkpoint as dcp

    return _load_with(lambda: dcp.FileSystemReader(str(directory)), into)


def _load_with(reader: Callable[[], Any], into: dict[str, Any] | None) -> dict[str, Any]:
    """`load` through DCP's StorageReader `reader()` (a directory's, or the store's)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    keys = set(reader().read_metadata().state_dict_metadata)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    skeleton_key = f"{SKELETON}{rank}" if f"{SKELETON}{rank}" in keys else f"{SKELETON}0"
    in_place: dict[str, Any] = {}
    if into is not None:
        _, template = _split(into)
        in_place = {k: v for k, v in template.items() if k in keys}
        dcp.load(in_place, storage_reader=reader())
    whole = _read_whole(
        reader(), {k for k in keys if k.startswith(TENSOR) and k not in in_place} | {skeleton_key}
    )
    blob = _as_bytes(whole.pop(skeleton_key))
    check = getattr(reader(), "check_skeleton", None)
    if check is not None:  # its sha256 before it is unpickled (a block's CRC32 guards damage, not forgery)
        check(int(skeleton_key.removeprefix(SKELETON)), blob)
    skeleton = pickle.loads(blob)
    return dict(_fill(skeleton, {**whole, **in_place}))


def _read_whole(reader: Any, keys: set[str]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from spotguard_agent.dcp_load import WholePlanner

    out: dict[str, Any] = {}
    planner = WholePlanner(keys=keys)
    _load_state_dict(out, storage_reader=reader, planner=planner, no_dist=True)
    return {k: planner.state_dict.get(k, v) for k, v in out.items()}

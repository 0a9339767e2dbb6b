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
written straight into the checkpoint's directory; for S3 into a local directory, then uploaded.

What is kept: every tensor, under the path of keys that leads to it; the state's other values (numbers,
strings, the optimizer's param_groups, the structure itself with its key types) as this rank's
`skeleton`. A tensor under the same path in every rank is taken to be replicated (written once, from
one rank): keep per-rank tensors (a CPU RNG state that differs by rank) under a path of their own rank,
e.g. {"rng": {rank: torch.get_rng_state()}}.

Checkpoints written by earlier agents (one `state.pt`) load as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import os
import pickle
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from spotguard_agent.agent import Agent
from spotguard_agent.manifest import FileEntry
from spotguard_agent.snapshot import HostBuffers

STATE_FILE = "state.pt"  # the earlier single-file format, still loaded
TENSOR = "t:"  # DCP keys: t:<path of the tensor in the state>
SKELETON = "skeleton:"  # skeleton:<rank>: the state's structure and values that are not tensors
SEP = "/"
_BUFFER = 4 * 1024 * 1024
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
    payload: dict[str, Any] = {**tensors, f"{SKELETON}{agent.ranks.rank}": _as_tensor(pickle.dumps(skeleton))}
    threads = _threads(agent)

    def write(directory: Path, group: Any) -> list[FileEntry]:
        import torch.distributed.checkpoint as dcp

        fs = HashingFileSystem()
        writer = dcp.FileSystemWriter(directory, thread_count=threads, sync_files=True, overwrite=True)
        writer.fs = fs
        dcp.save(payload, storage_writer=writer, process_group=group, no_dist=group is None)
        return fs.entries()

    agent.commit_parts(write, step, progress, sync=sync)
    agent.note_cost(time.monotonic() - started)


def _threads(agent: Agent) -> int:
    if agent.env.write_threads:
        return agent.env.write_threads
    cores = os.cpu_count() or 1
    return max(1, min(8, cores // max(1, agent.ranks.local_world)))


# ------------------------------------------------------------------------------------------- load
def load(directory: Path, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state saved by `save`, from a restored checkpoint directory. Without `into`: every value,
    tensors whole on the CPU (in any number of processes). With `into` (a state of the same structure,
    such as the model's and optimizer's state dicts under FSDP): its tensors are loaded in place, each
    rank reading its own part of a DTensor (resharded when the checkpoint was written by another number
    of ranks), a collective call in every rank; the state returned holds them."""
    directory = Path(directory)
    if (directory / STATE_FILE).exists():
        return dict(torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False))
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(directory))
    keys = set(reader.read_metadata().state_dict_metadata)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    skeleton_key = f"{SKELETON}{rank}" if f"{SKELETON}{rank}" in keys else f"{SKELETON}0"
    in_place: dict[str, Any] = {}
    if into is not None:
        _, template = _split(into)
        in_place = {k: v for k, v in template.items() if k in keys}
        dcp.load(in_place, storage_reader=dcp.FileSystemReader(str(directory)))
    whole = _read_whole(
        directory, {k for k in keys if k.startswith(TENSOR) and k not in in_place} | {skeleton_key}
    )
    skeleton = pickle.loads(_as_bytes(whole.pop(skeleton_key)))
    return dict(_fill(skeleton, {**whole, **in_place}))


def _read_whole(directory: Path, keys: set[str]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    out: dict[str, Any] = {}
    _load_state_dict(
        out,
        storage_reader=dcp.FileSystemReader(str(directory)),
        planner=_EmptyStateDictLoadPlanner(keys=keys),
        no_dist=True,
    )
    return out


# ------------------------------------------------------------------------------- hashing writers
def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


class _HashingRaw(io.FileIO):
    """A file written from start to end, hashed as it is written (no second read)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "wb", opener=_no_follow)
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, b: Any) -> int:
        n = super().write(b)
        if n:
            self.sha.update(memoryview(b).cast("B")[:n])
            self.size += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("written from start to end only (hashed as it is written)")


class _DurableWriter(io.BufferedWriter):
    """Buffered; asking its descriptor (to fsync it, as DCP does) flushes the buffer first."""

    def fileno(self) -> int:
        self.flush()
        return super().fileno()


@contextlib.contextmanager
def _no_zip_crc32() -> Iterator[None]:
    """torch.save without the CRC32 of every record, in this thread while a file is written (the
    setting is per thread; restored after, so the job's own torch.save calls keep theirs). The file's
    sha256, taken as it is written and checked on restore, covers what the CRC would; computing the CRC
    costs as much CPU as the sha256 itself (0.33 s against 0.44 s a 0.5 GiB state, one core) on the
    path the stop checkpoint must cross in time. torch.load reads such files as any other."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    set_ = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or set_ is None:  # a torch without the setting: CRC32 as always
        yield
        return
    before = get()
    set_(False)
    try:
        yield
    finally:
        set_(before)


def _filesystem_base() -> type:
    from torch.distributed.checkpoint.filesystem import FileSystem

    return FileSystem


class HashingFileSystem(_filesystem_base()):  # type: ignore[misc]
    """DCP's local file system, but every file it writes is hashed while written (sha256 and size
    recorded by name) and never written through a symbolic link."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, str]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        raw = _HashingRaw(path)
        stream = _DurableWriter(raw, buffer_size=_BUFFER)
        with stream, _no_zip_crc32():
            yield stream
        with self._lock:
            self._files[path.name] = (raw.size, raw.sha.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            self._files[Path(new_path).name] = self._files.pop(Path(path).name)

    def entries(self) -> list[FileEntry]:
        with self._lock:
            return [
                FileEntry(path=name, size=size, sha256=sha)
                for name, (size, sha) in sorted(self._files.items())
            ]

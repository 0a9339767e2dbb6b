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

import contextlib
import ctypes
import hashlib
import io
import os
import pickle
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from spotguard_agent.agent import Agent
from spotguard_agent.manifest import FileEntry
from spotguard_agent.snapshot import HostBuffers
from spotguard_agent.store import Parts
from spotguard_agent.store_errors import OtherRankFailed

STATE_FILE = "state.pt"  # the earlier single-file format, still loaded
TENSOR = "t:"  # DCP keys: t:<path of the tensor in the state>
SKELETON = "skeleton:"  # skeleton:<rank>: the state's structure and values that are not tensors
SEP = "/"
STREAMED = "streamed"  # DCP's path for a checkpoint whose files are streamed up (only their names count)
_BUFFER = 4 * 1024 * 1024
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
    payload: dict[str, Any] = {**tensors, f"{SKELETON}{agent.ranks.rank}": _as_tensor(pickle.dumps(skeleton))}
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
        return fs.entries()

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


class _CheckedWriter(FileSystemWriter):  # type: ignore[misc]
    """DCP's FileSystemWriter, but a save whose writer threads did not write every item fails. DCP's
    extra writer threads end on an error (a full disk, an upload refused) without telling the save,
    which would otherwise go on to write metadata of a checkpoint without those tensors, and the agent
    commit it."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        written = len(future.wait())
        if written != len(plan.items):
            why = getattr(self.fs, "first_error", None)
            part = "this process's part" if self.rank is None else f"rank {self.rank}'s part"
            raise OSError(
                f"{len(plan.items) - written} of {len(plan.items)} items of {part} of the checkpoint "
                f"not written: {why or 'a writer thread failed'}"
            )
        return future


class _HashingSink(io.RawIOBase):
    """Writes to `sink` (a streamed upload), hashing what it writes. Closing it does not end the sink:
    the upload completes only when its own context ends without an error."""

    def __init__(self, sink: Any) -> None:
        super().__init__()
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:  # DCP records where each item starts
        return self.size

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self.sink.write(view)
        self.sha.update(view)
        self.size += len(view)
        return len(view)


class HashingFileSystem(FileSystem):  # type: ignore[misc]
    """DCP's local file system, but every file it writes is hashed while written (sha256 and size
    recorded by name) and never written through a symbolic link. With `open` (store.Parts.open: S3),
    every file is streamed up through `open(name)` instead of written to a disk; DCP's metadata, which
    it writes under a temporary name and renames, is kept in memory until renamed, then sent."""

    def __init__(self, open: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None) -> None:
        super().__init__()
        self._open = open
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, str]] = {}
        self._held: dict[str, bytes] = {}  # streamed: files written under a temporary name
        self.first_error: str | None = None  # of a file that could not be written, in one line

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = Path(path).name
        try:
            if self._open is None:
                raw: _HashingRaw | _HashingSink = _HashingRaw(Path(path))
                with _DurableWriter(raw, buffer_size=_BUFFER) as stream, _no_zip_crc32():
                    yield stream
            elif name.endswith(".tmp"):
                with io.BytesIO() as held:
                    yield held
                    self._held[name] = held.getvalue()
                return
            else:
                with self._open(name) as sink:
                    raw = _HashingSink(sink)
                    with io.BufferedWriter(raw, buffer_size=_BUFFER) as stream, _no_zip_crc32():
                        yield stream
        except BaseException as exc:
            with self._lock:
                self.first_error = self.first_error or f"{name}: {type(exc).__name__}: {exc}"
            raise
        with self._lock:
            self._files[name] = (raw.size, raw.sha.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        old, new = Path(path).name, Path(new_path).name
        if self._open is not None and old in self._held:
            data = self._held.pop(old)
            with self._open(new) as sink:
                raw = _HashingSink(sink)
                raw.write(data)
            with self._lock:
                self._files[new] = (raw.size, raw.sha.hexdigest())
            return
        super().rename(path, new_path)
        with self._lock:
            self._files[new] = self._files.pop(old)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        if self._open is None:
            super().mkdir(path)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        # streamed: a checkpoint's sequence is new, so nothing of it exists yet
        return False if self._open is not None else bool(super().exists(path))

    def entries(self) -> list[FileEntry]:
        with self._lock:
            if self.first_error is not None:
                raise OSError(f"a file of the checkpoint was not written: {self.first_error}")
            return [
                FileEntry(path=name, size=size, sha256=sha)
                for name, (size, sha) in sorted(self._files.items())
            ]

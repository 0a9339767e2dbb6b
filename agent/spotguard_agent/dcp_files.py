"""How torch_state's checkpoints are written: DCP's file system, but every file hashed as it is written
(sha256 of the whole file, for the manifest) and cut into blocks with a CRC32 each (for restores that read
part of a file), never through a symbolic link, and streamed to S3 when the store says so.

Blocks. A file's block ends wherever DCP asks the stream where it stands (`tell()`: at the start and end
of every item it writes) and at most every BLOCK bytes; so an item is a whole number of blocks, and a rank
that loads one item (its shard of a tensor) reads just that item's bytes and verifies them as they arrive
(dcp_reader). Each process writes the blocks of its files into one small file of the checkpoint,
`blocks.<rank>.json` (BLOCKS_FILE), which the manifest lists like any other file; each data file's
manifest entry names it (FileEntry.blocks)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from spotguard_agent.manifest import FileEntry
from spotguard_agent.store_errors import CheckpointDamaged

_BUFFER = 4 * 1024 * 1024
BLOCK = 16 * 1024 * 1024  # at most this many bytes a block (one ranged read; S3's part size)
BLOCKS_FILE = "blocks.{rank}.json"


class _Blocks:
    """The CRC32 of each block of a file written from start to end (see the module's doc). A CRC32, the
    check S3 itself offers on its objects, rather than a second sha256: it finds the damage a restore
    must pass over at 2.4 times the speed (3.7 GB/s against 1.6 a core here), on the stop checkpoint's
    path; the manifest's sha256 of each whole file stays what it was."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int, str]] = []  # (offset, length, CRC32 in 8 hex digits)
        self.start = 0
        self.at = 0
        self.crc = 0
        self.cuts: list[int] = []  # positions past `start` where a block must end (tell())

    def cut(self, position: int) -> None:
        """A block ends at `position`: now, when every byte before it has been hashed (the stream was
        flushed), else when the bytes reach it. A position already passed cannot be cut (the reader
        then reads the block around it)."""
        if position == self.at:
            self._close()
        elif position > self.at and position not in self.cuts:
            self.cuts.append(position)
            self.cuts.sort()

    def update(self, view: memoryview) -> None:
        while len(view):
            end = min(self.start + BLOCK, *(c for c in self.cuts if c > self.at), self.at + len(view))
            n = end - self.at
            self.crc = zlib.crc32(view[:n], self.crc)
            self.at, view = end, view[n:]
            if end == self.start + BLOCK or end in self.cuts:
                self._close()

    def _close(self) -> None:
        if self.at > self.start:
            self.done.append((self.start, self.at - self.start, f"{self.crc:08x}"))
            self.start, self.crc = self.at, 0
        self.cuts = [c for c in self.cuts if c > self.at]

    def finish(self) -> list[tuple[int, int, str]]:
        self._close()
        return self.done


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


class _HashingRaw(io.FileIO):
    """A file written from start to end, hashed (whole and by block) as it is written (no second read)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "wb", opener=_no_follow)
        self.sha = hashlib.sha256()
        self.blocks = _Blocks()
        self.size = 0

    def write(self, b: Any) -> int:
        n = super().write(b)
        if n:
            view = memoryview(b).cast("B")[:n]
            self.sha.update(view)
            self.blocks.update(view)
            self.size += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("written from start to end only (hashed as it is written)")


class _CuttingWriter(io.BufferedWriter):
    """Buffered; where DCP asks where the stream stands (an item's start or end), a block of the file
    ends (_Blocks)."""

    def tell(self) -> int:
        position = super().tell()
        self.raw.blocks.cut(position)
        return position


class _DurableWriter(_CuttingWriter):
    """Asking its descriptor (to fsync it, as DCP does) flushes the buffer first."""

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
        self.blocks = _Blocks()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:  # DCP records where each item starts
        return self.size

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self.sink.write(view)
        self.sha.update(view)
        self.blocks.update(view)
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
        self._files: dict[str, tuple[int, str, list[tuple[int, int, str]]]] = {}  # size, sha256, blocks
        self._directory: Path | None = None  # where the files are written (a file:// store)
        self._held: dict[str, bytes] = {}  # streamed: files written under a temporary name
        self.first_error: str | None = None  # of a file that could not be written, in one line

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = Path(path).name
        self._directory = Path(path).parent
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
                    with _CuttingWriter(raw, buffer_size=_BUFFER) as stream, _no_zip_crc32():
                        yield stream
        except BaseException as exc:
            with self._lock:
                self.first_error = self.first_error or f"{name}: {type(exc).__name__}: {exc}"
            raise
        with self._lock:
            self._files[name] = (raw.size, raw.sha.hexdigest(), raw.blocks.finish())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        old, new = Path(path).name, Path(new_path).name
        if self._open is not None and old in self._held:
            data = self._held.pop(old)
            with self._open(new) as sink:
                raw = _HashingSink(sink)
                raw.write(data)
            with self._lock:
                self._files[new] = (raw.size, raw.sha.hexdigest(), raw.blocks.finish())
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

    def entries(self, rank: int = 0, skeleton_sha256: str = "") -> list[FileEntry]:
        """Every file written, with its size and sha256, and the file of their blocks (BLOCKS_FILE,
        written here, last) named by each: what this process adds to the checkpoint's manifest."""
        with self._lock:
            if self.first_error is not None:
                raise OSError(f"a file of the checkpoint was not written: {self.first_error}")
            files = dict(sorted(self._files.items()))
        if not files or self._directory is None:
            return []
        blocks = BLOCKS_FILE.format(rank=rank)
        listing: dict[str, Any] = {"checksum": "crc32", "files": {n: b for n, (_, _, b) in files.items()}}
        if skeleton_sha256:  # torch_state's: checked before the skeleton is unpickled
            listing["skeleton_sha256"] = skeleton_sha256
        body = json.dumps(listing, separators=(",", ":"))
        with self.create_stream(self._directory / blocks, "wb") as stream:
            stream.write(body.encode())
            if self._open is None:
                os.fsync(stream.fileno())
        size, sha, _ = self._files[blocks]
        return [
            *(FileEntry(path=n, size=z, sha256=h, blocks=blocks) for n, (z, h, _) in files.items()),
            FileEntry(path=blocks, size=size, sha256=sha),
        ]


# ------------------------------------------------------------- the blocks, as restore checks them
def matches(data: memoryview, digest: str | None) -> bool:
    """Does `data` have this digest: a CRC32 (8 hex digits: a block), or a sha256 (64: a whole file)?"""
    if digest is None:
        return True
    if len(digest) == 8:
        return f"{zlib.crc32(data):08x}" == digest
    return hashlib.sha256(data).hexdigest() == digest


def parse_blocks(name: str, body: bytes) -> dict[str, list[tuple[int, int, str]]] | None:
    try:
        listing = json.loads(body)
        files = listing["files"]
        if listing.get("checksum") != "crc32":
            return None  # checked some other way (a newer agent's): each file read whole, its sha256
        return {p: [(int(s), int(n), str(h)) for s, n, h in b] for p, b in files.items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{name} is not a list of blocks ({exc})") from None


def tiles(blocks: list[tuple[int, int, str]], size: int) -> bool:
    at = 0
    for start, length, _ in blocks:
        if start != at or length <= 0:
            return False
        at += length
    return at == size

"""DCP's reader of a committed checkpoint straight from the store (S3 or a file:// directory), with no
local copy: each rank fetches only the items its load plan names (its own shards when the world size is
the same; the overlapping ones when DCP reshards to another), with parallel ranged reads, each block
verified against its CRC32 as it arrives (spotguard_agent.dcp_files writes the blocks at save time).

- `.metadata` and the blocks files are small: read whole, verified against the manifest's sha256.
- A data file's item is read as the blocks that cover it (an item is a whole number of blocks: they end
  where items do); a file written without blocks (by an earlier agent) is read whole and verified whole.
- An item of at least DIRECT bytes is read into a buffer of its own, aligned as torch allocates, on which
  the loaded tensor's storage then lies (spotguard_agent.dcp_load): its bytes are copied once, from the store
  into memory, or twice when they go into a state the job made (`into`); smaller ones share reads.
- Up to `concurrency` reads in flight; the items are loaded into the ranks' state in order while the next
  ones are read, with at most `window` bytes of reads sent and not yet loaded (beyond it, at most the
  rest of the buffer of a large item whose first read was sent).

A block whose bytes do not match, a file the manifest does not list, or a file shorter than the manifest
says is CheckpointDamaged (restore passes over the checkpoint); any other failure to read goes up as it is
(botocore's retries have been spent), for the restore to tell transient from not.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader

from spotguard_agent.dcp_files import BLOCK, BLOCKS_FILE, matches, parse_blocks, tiles
from spotguard_agent.dcp_load import _load
from spotguard_agent.manifest import FileEntry, Manifest
from spotguard_agent.snapshot import writable
from spotguard_agent.store_errors import _READ_ERRORS, CheckpointDamaged, is_damage, is_transient

RUN_TRIES = 3  # of one ranged read that fails in a way that may pass
RUN_PAUSE = 0.2  # seconds before the second try, doubled before the third


class NotReadable(RuntimeError):
    """The checkpoint is in a form this agent does not read (DCP's transforms), or the store does not
    answer ranged reads: no damage (the previous checkpoint would fail alike), and no retry mends it."""


METADATA = ".metadata"  # DCP's file of what is where
READ_BYTES = BLOCK  # adjacent blocks a rank needs are read together, up to this many bytes a request
DIRECT = 64 * 1024  # an item at least this long is read into a buffer of its own (see the module's doc)


Block = tuple[int, int, str | None]  # start, length, CRC32 (or a whole file's sha256)


@dataclass
class _Range:
    """Bytes [offset, offset + length) of a file that hold one or more read items: its blocks, each as
    (its read's index, its place in that read). A direct range's blocks land in `buffer`, made when the
    first of its reads is sent."""

    offset: int
    length: int
    items: list[ReadItem]
    direct: bool
    parts: list[tuple[int, int]] = field(default_factory=list)
    buffer: torch.Tensor | None = None

    @property
    def needed(self) -> list[int]:
        return sorted({i for i, _ in self.parts})

    def view(self) -> memoryview:
        if self.buffer is None:
            self.buffer = torch.empty(self.length, dtype=torch.uint8)
        return writable(self.buffer)


@dataclass
class _Run:
    """One ranged read: adjacent blocks of a file, from the first's start to the last's end, each block
    read into its own place: its direct range's buffer, or the read's own bytes."""

    path: str
    blocks: list[Block]
    into: list[_Range | None]  # each block's direct range (None: the read's own bytes)
    users: int = 0  # ranges still to be loaded that need its bytes
    future: Future[None] | None = None
    views: list[memoryview] | None = None  # each block's bytes, once the read is sent

    @property
    def start(self) -> int:
        return self.blocks[0][0]

    @property
    def end(self) -> int:
        return self.blocks[-1][0] + self.blocks[-1][1]

    @property
    def size(self) -> int:
        return self.end - self.start

    def send(self) -> None:
        """Where each block's bytes go, made now: never every range's buffer at once."""
        own = sum(n for (_, n, _), d in zip(self.blocks, self.into, strict=True) if d is None)
        spare, at, self.views = memoryview(bytearray(own)), 0, []
        for (start, n, _), direct in zip(self.blocks, self.into, strict=True):
            if direct is not None:
                self.views.append(direct.view()[start - direct.offset : start - direct.offset + n])
            else:
                self.views.append(spare[at : at + n])
                at += n


@dataclass
class ReadCounts:
    """What one restore read: bytes (metadata, blocks files and data) and requests."""

    bytes: int = 0
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n
            self.requests += 1


class StoreReader(StorageReader):  # type: ignore[misc]
    def __init__(self, store: Any, manifest: Manifest, concurrency: int = 8, window: int = 0) -> None:
        super().__init__()
        self.store = store  # spotguard_agent.store.CheckpointStore
        self.manifest = manifest
        self.files: dict[str, FileEntry] = {e.path: e for e in manifest.files}
        self.concurrency = max(1, concurrency)
        self.window = window or 2 * self.concurrency * BLOCK
        self.counts = ReadCounts()
        self.storage_data: dict[Any, Any] = {}
        self.load_id = uuid.uuid4().hex
        self._blocks: dict[
            str, dict[str, list[tuple[int, int, str]]] | None
        ] = {}  # blocks file -> its files'
        self._checked: dict[str, list[tuple[int, int, str]]] = {}  # a data file's blocks, checked
        self._starts: dict[str, list[int]] = {}  # where each of them starts
        self._whole: dict[str, bytes] = {}  # the small files read whole (.metadata: read more than once)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------ DCP's StorageReader
    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # made for one manifest, never picked by DCP for a path

    def read_metadata(self) -> Metadata:  # no `rank=`: DCP then never reads it per rank on its own
        metadata = pickle.loads(self.whole(METADATA))  # verified against the manifest first
        if not isinstance(metadata, Metadata):
            raise CheckpointDamaged(f"{METADATA} is not DCP's metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kw: Any) -> None:
        self.storage_data = metadata.storage_data or {}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        ranges: dict[tuple[str, int, int], list[ReadItem]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if getattr(info, "transform_descriptors", None):
                raise NotReadable(f"{info.relative_path}: stored with transforms this agent does not read")
            ranges.setdefault((info.relative_path, info.offset, info.length), []).append(item)
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="spotguard-restore") as pool:
            try:
                for data, owner, items in self._fetched(pool, sorted(ranges.items())):
                    for item in items:
                        _load(planner, item, data, owner)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    # -------------------------------------------------------------------------------------- reads
    def _fetched(
        self, pool: ThreadPoolExecutor, ranges: list[tuple[tuple[str, int, int], list[ReadItem]]]
    ) -> Iterator[tuple[memoryview, torch.Tensor | None, list[ReadItem]]]:
        """Each range's bytes (and the buffer of its own they are in, if any), in order, while the next
        reads run (at most `window` bytes ahead of the one being loaded); a read's bytes are let go once
        every range that needs them is loaded."""
        reads, jobs = self._plan(ranges)
        submitted = ahead = 0
        for job in jobs:
            needed = job.needed
            last = max(needed, default=-1)
            while submitted < len(reads) and (submitted <= last or ahead < self.window):
                run = reads[submitted]
                run.send()
                run.future = pool.submit(self._read_run, run)
                ahead += run.size
                submitted += 1
            for i in needed:
                reads[i].future.result()  # type: ignore[union-attr]
            if job.direct:
                yield writable(job.buffer), job.buffer, job.items  # type: ignore[arg-type]
                job.buffer = None  # the state holds it now if a tensor's storage lies on it
            else:
                yield _assembled(reads, job), None, job.items
            for i in needed:
                reads[i].users -= 1
                if reads[i].users == 0:
                    reads[i].future = reads[i].views = None
                    ahead -= reads[i].size

    def _plan(
        self, ranges: list[tuple[tuple[str, int, int], list[ReadItem]]]
    ) -> tuple[list[_Run], list[_Range]]:
        """The reads (runs of adjacent blocks of a file, up to READ_BYTES each, every block read once)
        and the ranges in order, each with its blocks' places in them."""
        reads: list[_Run] = []
        where: dict[tuple[str, int], tuple[int, int]] = {}  # (file, block start) -> its read, its place
        jobs = []
        for (path, offset, length), items in ranges:
            spans = self._spans(path, offset, length)
            direct = length >= DIRECT and _exactly(spans, offset, length)
            job = _Range(offset, length, items, direct and not any((path, b[0]) in where for b in spans))
            for block in spans:
                key = (path, block[0])
                if key not in where:
                    last = reads[-1] if reads else None
                    if (
                        last
                        and last.path == path
                        and last.end == block[0]
                        and last.size + block[1] <= READ_BYTES
                    ):
                        last.blocks.append(block)
                        last.into.append(job if job.direct else None)
                    else:
                        reads.append(_Run(path, [block], [job if job.direct else None]))
                    where[key] = (len(reads) - 1, len(reads[-1].blocks) - 1)
                job.parts.append(where[key])
            for i in job.needed:
                reads[i].users += 1
            jobs.append(job)
        return reads, jobs

    def _spans(self, path: str, offset: int, length: int) -> list[Block]:
        """The blocks of `path` that cover [offset, offset + length), each with its CRC32; a file
        without blocks is one block, checked against the file's sha256."""
        entry = self._entry(path)
        if offset < 0 or length < 0 or offset + length > entry.size:
            raise CheckpointDamaged(f"{path}: an item at {offset}+{length} lies past its {entry.size} bytes")
        if length == 0:
            return []
        blocks = self._blocks_of(entry)
        if blocks is None:
            return [(0, entry.size, entry.sha256)]
        starts = self._starts[path]
        first = bisect.bisect_right(starts, offset) - 1
        last = bisect.bisect_left(starts, offset + length)
        return list(blocks[max(first, 0) : last])

    def _read_run(self, run: _Run) -> None:
        """One ranged read of adjacent blocks, each block checked against its CRC32; tried again, after a
        short pause, when it failed in a way that may pass (botocore retries each request, but not a
        body cut short), so that one such read among thousands does not send every rank back to the
        start."""
        assert run.views is not None
        for attempt in range(RUN_TRIES):
            try:
                self._read(run.path, run.start, run.views, run.blocks)
                return
            except _READ_ERRORS as exc:
                if is_damage(exc) or not is_transient(exc) or attempt == RUN_TRIES - 1:
                    raise
                time.sleep(RUN_PAUSE * 2**attempt)

    def check_skeleton(self, rank: int, blob: bytes) -> None:
        """torch_state's skeleton of `rank` has the sha256 its blocks file says, when it says one."""
        name = BLOCKS_FILE.format(rank=rank)
        if name not in self.files:
            return
        want = json.loads(self.whole(name)).get("skeleton_sha256")
        if want and hashlib.sha256(blob).hexdigest() != want:
            raise CheckpointDamaged(f"rank {rank}'s skeleton does not match its sha256")

    def _read(self, path: str, start: int, into: list[memoryview], blocks: list[Block]) -> None:
        """Bytes [start, ...) of `path`, one block into each of `into` in order, each block checked."""
        size = sum(len(v) for v in into)
        got = self.store.backend.read_range(
            self.store.location.key(self.manifest.sequence, path), start, into
        )
        self.counts.add(min(got, size))
        if got < size:
            raise CheckpointDamaged(f"{path}: shorter than its manifest says (bytes {start}-{start + size})")
        if got > size:
            raise NotReadable(f"{path}: the store answered a ranged read with {got} bytes, not {size}")
        for (at, n, digest), view in zip(blocks, into, strict=True):
            if not matches(view, digest):
                raise CheckpointDamaged(f"{path}: bytes {at}-{at + n} do not match their checksum")

    def whole(self, path: str) -> bytes:
        """A small file of the checkpoint, read whole and verified against the manifest (once)."""
        with self._lock:
            held = self._whole.get(path)
        if held is None:
            entry = self._entry(path)
            into = memoryview(bytearray(entry.size))
            self._read(path, 0, [into], [(0, entry.size, entry.sha256)])
            held = bytes(into)
            with self._lock:
                self._whole[path] = held
        return held

    def _entry(self, path: str) -> FileEntry:
        entry = self.files.get(path)
        if entry is None:
            raise CheckpointDamaged(f"{path} is not in checkpoint {self.manifest.sequence}'s manifest")
        return entry

    def _blocks_of(self, entry: FileEntry) -> list[tuple[int, int, str]] | None:
        """`entry`'s blocks, checked once to cover the file end to end; None: it has none."""
        if entry.blocks is None:
            return None
        with self._lock:
            checked = self._checked.get(entry.path)
        if checked is not None:
            return checked
        with self._lock:
            listing = self._blocks.get(entry.blocks)
        if listing is None:
            listing = parse_blocks(entry.blocks, self.whole(entry.blocks))
            with self._lock:
                self._blocks[entry.blocks] = listing
        if listing is None:  # blocks this agent cannot check: the whole file, against its sha256
            return None
        blocks = listing.get(entry.path)
        if blocks is None or not tiles(blocks, entry.size):
            raise CheckpointDamaged(f"{entry.blocks} does not list {entry.path}'s blocks end to end")
        with self._lock:
            self._checked[entry.path] = blocks
            self._starts[entry.path] = [s for s, _, _ in blocks]
        return blocks


def _assembled(reads: list[_Run], job: _Range) -> memoryview:
    """A shared range's bytes, from its blocks' places in the reads (a slice of one block, without a
    copy, when one covers it all: a file without blocks is one)."""
    if job.length == 0:
        return memoryview(b"")
    pieces = []
    for i, k in job.parts:
        start, n, _ = reads[i].blocks[k]
        views = reads[i].views
        assert views is not None
        lo, hi = max(start, job.offset), min(start + n, job.offset + job.length)
        pieces.append(views[k][lo - start : hi - start])
    if len(pieces) == 1:
        return pieces[0]
    return memoryview(b"".join(pieces))


def _exactly(spans: list[Block], offset: int, length: int) -> bool:
    """Do the blocks cover [offset, offset + length) and nothing more (so they can fill its buffer)?"""
    return bool(spans) and spans[0][0] == offset and spans[-1][0] + spans[-1][1] == offset + length

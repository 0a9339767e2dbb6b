"""DCP's reader of a committed checkpoint straight from the store (S3 or a file:// directory), with no
local copy: each rank fetches only the items its load plan names (its own shards when the world size is
the same; the overlapping ones when DCP reshards to another), with parallel ranged reads, each block
verified against its sha256 as it arrives (spotguard_agent.dcp_files writes the blocks at save time).

- `.metadata` and the blocks files are small: read whole, verified against the manifest's sha256.
- A data file's item is read as the blocks that cover it (an item is a whole number of blocks: they end
  where items do); a file written without blocks (by an earlier agent) is read whole and verified whole.
- Up to `concurrency` reads in flight; the items are loaded into the ranks' state in order while the next
  ones are read, with at most `window` bytes fetched and not yet loaded.

A block whose bytes do not match, a file the manifest does not list, or a file shorter than the manifest
says is CheckpointDamaged (restore passes over the checkpoint); any other failure to read goes up as it is
(botocore's retries have been spent), for the restore to tell transient from not.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader

from spotguard_agent.dcp_files import BLOCK
from spotguard_agent.manifest import FileEntry, Manifest
from spotguard_agent.store_errors import CheckpointDamaged

METADATA = ".metadata"  # DCP's file of what is where
# a range being read: (its offset in the file, the read items it serves, (start, bytes) of each block
# read for it, its length)
_Pending = tuple[int, list[ReadItem], list[tuple[int, Future[bytes]]], int]


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
        self._blocks: dict[str, dict[str, list[tuple[int, int, str]]]] = {}  # blocks file -> its files'
        self._whole: dict[str, bytes] = {}  # the small files read whole (.metadata: read more than once)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------ DCP's StorageReader
    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # made for one manifest, never picked by DCP for a path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
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
                raise CheckpointDamaged(
                    f"{info.relative_path}: stored with transforms this agent does not read"
                )
            ranges.setdefault((info.relative_path, info.offset, info.length), []).append(item)
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="spotguard-restore") as pool:
            try:
                for data, items in self._fetched(pool, sorted(ranges.items())):
                    for item in items:
                        _load(planner, item, data)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    # -------------------------------------------------------------------------------------- reads
    def _fetched(
        self, pool: ThreadPoolExecutor, ranges: list[tuple[tuple[str, int, int], list[ReadItem]]]
    ) -> Iterator[tuple[memoryview, list[ReadItem]]]:
        """Each range's bytes, in order, while the next ones are read (at most `window` bytes ahead)."""
        pending: deque[tuple[_Pending, int]] = deque()
        ahead = 0
        for (path, offset, length), items in ranges:
            spans = self._spans(path, offset, length)
            futures = [(start, pool.submit(self._read, path, start, size, sha)) for start, size, sha in spans]
            fetched = sum(size for _, size, _ in spans)
            pending.append(((offset, items, futures, length), fetched))
            ahead += fetched
            while ahead > self.window and len(pending) > 1:
                entry, fetched = pending.popleft()
                ahead -= fetched
                yield self._joined(entry)
        while pending:
            yield self._joined(pending.popleft()[0])

    @staticmethod
    def _joined(entry: _Pending) -> tuple[memoryview, list[ReadItem]]:
        offset, items, futures, length = entry
        if len(futures) == 1 and futures[0][0] == offset:
            data = futures[0][1].result()
            if len(data) == length:
                return memoryview(data), items
        out = bytearray(length)
        for start, future in futures:
            block = memoryview(future.result())
            lo, hi = max(start, offset), min(start + len(block), offset + length)
            out[lo - offset : hi - offset] = block[lo - start : hi - start]
        return memoryview(out), items

    def _spans(self, path: str, offset: int, length: int) -> list[tuple[int, int, str | None]]:
        """The reads that cover [offset, offset + length) of `path`: its blocks there, each with its
        sha256; a file without blocks read whole (its sha256 is the file's)."""
        entry = self._entry(path)
        if offset < 0 or length < 0 or offset + length > entry.size:
            raise CheckpointDamaged(f"{path}: an item at {offset}+{length} lies past its {entry.size} bytes")
        blocks = self._blocks_of(entry)
        if blocks is None:
            return [(0, entry.size, entry.sha256)]
        end = offset + length
        spans = [(s, n, h) for s, n, h in blocks if s < end and s + n > offset]
        return spans or [(offset, 0, hashlib.sha256().hexdigest())]

    def _read(self, path: str, start: int, size: int, sha256: str | None) -> bytes:
        data = self.store.backend.get_range(
            self.store.location.key(self.manifest.sequence, path), start, size
        )
        self.counts.add(len(data))
        if len(data) != size or (sha256 is not None and hashlib.sha256(data).hexdigest() != sha256):
            raise CheckpointDamaged(f"{path}: bytes {start}-{start + size} do not match their sha256")
        return data

    def whole(self, path: str) -> bytes:
        """A small file of the checkpoint, read whole and verified against the manifest (once)."""
        with self._lock:
            held = self._whole.get(path)
        if held is None:
            entry = self._entry(path)
            held = self._read(path, 0, entry.size, entry.sha256)
            with self._lock:
                self._whole[path] = held
        return held

    def _entry(self, path: str) -> FileEntry:
        entry = self.files.get(path)
        if entry is None:
            raise CheckpointDamaged(f"{path} is not in checkpoint {self.manifest.sequence}'s manifest")
        return entry

    def _blocks_of(self, entry: FileEntry) -> list[tuple[int, int, str]] | None:
        if entry.blocks is None:
            return None
        with self._lock:
            listing = self._blocks.get(entry.blocks)
        if listing is None:
            listing = _parse_blocks(entry.blocks, self.whole(entry.blocks))
            with self._lock:
                self._blocks[entry.blocks] = listing
        blocks = listing.get(entry.path)
        if blocks is None or not _tiles(blocks, entry.size):
            raise CheckpointDamaged(f"{entry.blocks} does not list {entry.path}'s blocks end to end")
        return blocks


def _parse_blocks(name: str, body: bytes) -> dict[str, list[tuple[int, int, str]]]:
    try:
        files = json.loads(body)["files"]
        return {p: [(int(s), int(n), str(h)) for s, n, h in b] for p, b in files.items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointDamaged(f"{name} is not a list of blocks ({exc})") from None


def _tiles(blocks: list[tuple[int, int, str]], size: int) -> bool:
    at = 0
    for start, length, _ in blocks:
        if start != at or length <= 0:
            return False
        at += length
    return at == size


def _load(planner: LoadPlanner, item: ReadItem, data: memoryview) -> None:
    """One read item into the state, as DCP's own FileSystemReader does it."""
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data))
        return
    tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise CheckpointDamaged(
            f"{item.storage_index.fqn}: stored as {tuple(tensor.size())}, wanted {target.size()}"
        )
    target.copy_(tensor)
    planner.commit_tensor(item, target)

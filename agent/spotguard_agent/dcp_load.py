"""How one item a rank read from the store becomes part of its state (spotguard_agent.dcp_reader): as
DCP's own FileSystemReader does it, but from the bytes in place. An item DCP stored with torch.save (a
zip: a small pickle saying the tensor's dtype, size and strides, and its storage's bytes, stored as they
are) is decoded here, and the tensor's storage is the bytes read, with no copy, where they lie aligned in
a buffer of their own; anything else (another layout, a pickle with more in it) goes to torch.load as
DCP's reader would."""

from __future__ import annotations

import collections
import io
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from spotguard_agent.snapshot import writable
from spotguard_agent.store_errors import CheckpointDamaged


def _load(planner: LoadPlanner, item: ReadItem, data: memoryview, owner: torch.Tensor | None = None) -> None:
    """One read item into the state, as DCP's own FileSystemReader does it, but read from `data` in
    place. `owner`: a uint8 tensor whose bytes `data` is (aligned as torch allocates), on whose memory
    the loaded tensor's storage may lie; a whole tensor loaded for a planner that can take it as it is
    (WholePlanner) is then not copied at all."""
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data))
        return
    stored = stored_tensor(data, owner)
    if isinstance(planner, WholePlanner) and planner.adopt(item, stored):
        return
    tensor = narrow_tensor_by_index(stored, item.storage_offsets, item.lengths)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise CheckpointDamaged(
            f"{item.storage_index.fqn}: stored as {tuple(tensor.size())}, wanted {tuple(target.size())}"
        )
    target.copy_(tensor)
    planner.commit_tensor(item, target)


def stored_tensor(data: memoryview, owner: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor torch.save wrote as `data`, as torch.load would make it (a storage of its own bytes,
    the tensor's offset, size and strides in it): its storage is the bytes in `owner` (or in an aligned
    copy of `data`) with no copy, when it is a plain dense tensor stored as it is; else torch.load's."""
    layout = _plain_layout(data)
    if layout is None or layout.at % layout.dtype.itemsize:  # torch.save aligns it: leave it to torch.load
        return torch.load(_View(data), map_location="cpu", weights_only=True)
    if layout.nbytes == 0:
        tensor = torch.empty_strided(layout.size, layout.stride, dtype=layout.dtype)
    else:
        if owner is None:
            owner = torch.empty(len(data), dtype=torch.uint8)
            writable(owner)[:] = data
        own = writable(owner)[layout.at : layout.at + layout.nbytes]  # keeps `owner` alive
        storage = torch.frombuffer(own, dtype=layout.dtype).untyped_storage()  # these bytes only
        # set_, as torch.load's rebuild does: a tensor of its own on that storage, not a view of another
        tensor = torch.empty(0, dtype=layout.dtype).set_(storage, layout.offset, layout.size, layout.stride)
    return tensor.requires_grad_() if layout.requires_grad else tensor


@dataclass(frozen=True)
class _Layout:
    """Where a plain tensor's elements lie in torch.save's zip, and how the tensor views them."""

    dtype: torch.dtype
    at: int  # the storage's first byte in the zip
    nbytes: int  # the storage's bytes
    offset: int  # the tensor's first element in its storage
    size: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool


class _NotPlain(Exception):
    """The item holds more than one plain dense tensor: left to torch.load."""


_TYPED = {  # torch.save's storage classes of the tensors it pickles with _rebuild_tensor_v2
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}


PICKLE_BYTES = 64 * 1024  # a data.pkl larger than this is no plain tensor's: left to torch.load
_DTYPES = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


@dataclass(frozen=True)
class _StorageClass:
    dtype: torch.dtype | None  # None: UntypedStorage, whose tensor names its dtype


@dataclass(frozen=True)
class _Storage:
    dtype: torch.dtype | None
    key: str
    numel: int  # in elements of its dtype (in bytes when untyped)


@dataclass(frozen=True)
class _Rebuilt:
    """What _rebuilt recorded: the only result of data.pkl that _plain_layout takes."""

    storage: _Storage
    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool


def _rebuilt(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, *more: Any
) -> _Rebuilt:
    """torch._utils._rebuild_tensor_v2/_v3's arguments, recorded and checked, nothing built."""
    dtype = storage.dtype if isinstance(storage, _Storage) else None
    if more and isinstance(more[0], torch.dtype):  # v3: (..., dtype, metadata=None)
        dtype, more = more[0], more[1:]
    if (
        dtype is None
        or not isinstance(storage, _Storage)
        or any(m is not None for m in more)  # a tensor's Python state: torch.load rebuilds it
        or hooks
        or not isinstance(offset, int)
        or offset < 0
        or not isinstance(size, tuple | list)
        or not isinstance(stride, tuple | list)
        or not all(isinstance(v, int) and v >= 0 for v in (*size, *stride))
        or len(size) != len(stride)
    ):
        raise _NotPlain
    return _Rebuilt(storage, dtype, offset, tuple(size), tuple(stride), bool(grad))


class _Header(pickle.Unpickler):
    """torch.save's data.pkl of one tensor, read with nothing in it called but _rebuilt: any other
    global is _NotPlain (as torch.load's weights_only, but in C and with no object made)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuilt
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in _TYPED:
            return _StorageClass(_TYPED[name])
        if module == "torch.storage" and name == "UntypedStorage":
            return _StorageClass(None)
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        raise _NotPlain

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotPlain
        _, kind, key, _, numel = pid
        if not isinstance(kind, _StorageClass) or not isinstance(numel, int):
            raise _NotPlain
        return _Storage(kind.dtype, str(key), numel)


@dataclass(frozen=True)
class _Entry:
    """One record of torch.save's zip, as its central directory lists it."""

    header_offset: int  # its local header's
    file_size: int
    stored: bool  # not compressed (torch.save compresses nothing)


_EOCD = struct.Struct("<IHHHHIIH")  # the end of the central directory, with no comment (torch.save's)
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # one entry of the central directory, 46 bytes
_ZIP64 = 0xFFFFFFFF  # a size or offset moved to a zip64 field: such an archive goes to torch.load


def _entries(data: memoryview) -> dict[str, _Entry]:
    """The records of torch.save's zip from its central directory: what zipfile reads, without its
    generality (a tenth of its time per item); ValueError for anything else (a zip64 archive, a
    comment), which torch.load then reads."""
    signature, _, _, _, count, size, offset, comment = _EOCD.unpack_from(data, len(data) - _EOCD.size)
    if signature != 0x06054B50 or comment or _ZIP64 in (size, offset) or offset + size > len(data):
        raise ValueError("not torch.save's zip as this reader takes it")
    out, at = {}, offset
    for _ in range(count):
        fields = _CENTRAL.unpack_from(data, at)
        if fields[0] != 0x02014B50 or _ZIP64 in (fields[8], fields[9], fields[16]):
            raise ValueError("not torch.save's zip as this reader takes it")
        name_length, extra_length, comment_length = fields[10], fields[11], fields[12]
        name = bytes(data[at + 46 : at + 46 + name_length]).decode()
        out[name] = _Entry(header_offset=fields[16], file_size=fields[9], stored=fields[4] == 0)
        at += 46 + name_length + extra_length + comment_length
    return out


def _start(data: memoryview, record: _Entry) -> int:
    """Where a record's bytes start: past its local header, whose extra field pads them to alignment."""
    name_length, extra_length = struct.unpack_from("<HH", data, record.header_offset + 26)
    return int(record.header_offset + 30 + name_length + extra_length)


def _record(data: memoryview, record: _Entry) -> bytes:
    """A small record's bytes as stored (the blocks' CRC32s have checked them: torch.save may leave the
    zip's own out)."""
    if not record.stored:
        raise _NotPlain
    at = _start(data, record)
    return bytes(data[at : at + record.file_size])


def _plain_layout(data: memoryview) -> _Layout | None:
    """The layout of the one plain dense tensor torch.save wrote as `data`, or None: not that."""
    try:
        archive = _entries(data)
        pkl = next(n for n in archive if n.endswith("/data.pkl"))
        prefix = pkl.removesuffix("data.pkl")
        if _record(data, archive[f"{prefix}byteorder"]) != b"little":
            return None
        header = archive[pkl]
        if header.file_size > PICKLE_BYTES:  # one tensor's is some 200 bytes
            return None
        rebuilt = _Header(io.BytesIO(_record(data, header))).load()
        if not isinstance(rebuilt, _Rebuilt):
            return None
        storage, dtype, offset = rebuilt.storage, rebuilt.dtype, rebuilt.offset
        size, stride, grad = rebuilt.size, rebuilt.stride, rebuilt.requires_grad
        record = archive[f"{prefix}data/{storage.key}"]
        nbytes = storage.numel * (dtype.itemsize if storage.dtype is not None else 1)
        if not record.stored or record.file_size != nbytes:
            return None
        at = _start(data, record)
        elements = nbytes // dtype.itemsize
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) if all(size) else -1
        if nbytes % dtype.itemsize or at + nbytes > len(data) or last >= elements:
            return None
        return _Layout(dtype, at, nbytes, offset, size, stride, grad)
    except Exception:  # whatever the bytes hold that is not a plain tensor (a forged pickle's
        # MemoryError or RecursionError included) is left to torch.load, which says what it is
        return None


class WholePlanner(_EmptyStateDictLoadPlanner):  # type: ignore[misc]
    """DCP's planner of a load of whole tensors (torch_state.load without `into`), which takes a tensor
    stored in one piece as torch.load made it rather than copy it into one it made."""

    def adopt(self, item: ReadItem, tensor: torch.Tensor) -> bool:
        fqn = item.storage_index.fqn
        mine = self.state_dict.get(fqn)
        whole = isinstance(mine, torch.Tensor) and tensor.size() == mine.size() and tensor.dtype == mine.dtype
        if not whole or any(item.dest_offsets) or any(item.storage_offsets):
            return False
        self.state_dict[fqn] = tensor
        return True


class _View(io.RawIOBase):
    """A read-only, seekable file over a memoryview, with no copy of it (io.BytesIO would copy)."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self.data, self.at = data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self.data) - self.at)
        memoryview(b).cast("B")[:n] = self.data[self.at : self.at + n]
        self.at += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: len(self.data)}[whence]
        self.at = max(0, base + offset)
        return self.at

    def tell(self) -> int:
        return self.at

"""How one item a rank read from the store becomes part of its state (spotguard_agent.dcp_reader): as
DCP's own FileSystemReader does it, but read from the bytes in place, and a whole tensor taken as
torch.load made it rather than copied again."""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from spotguard_agent.store_errors import CheckpointDamaged


def _load(planner: LoadPlanner, item: ReadItem, data: memoryview) -> None:
    """One read item into the state, as DCP's own FileSystemReader does it, but read from `data` in
    place (io.BytesIO would copy it first), and a whole tensor loaded for a planner that can take it
    as it is (WholePlanner) is not copied again."""
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data))
        return
    stored = torch.load(_View(data), map_location="cpu", weights_only=True)
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

"""Host copies of a training state's tensors, at the speed of the GPU-to-host link.

The copies go into host buffers made once and reused while the state keeps its shapes: on a machine with
CUDA one block of pinned memory (pinning takes seconds per ten GiB, so never per checkpoint), every tensor
copied into its slice with non_blocking=True and one synchronize at the end; on a machine without CUDA
the same code with plain memory. Each tensor's copy owns a storage of exactly its bytes (a view into the
block made with torch.frombuffer), so the checkpoint's writers serialise it without copying it again.

DTensors (FSDP2, tensor parallel) keep their sharding: the copy is a DTensor whose local shard is on the
host, so torch.distributed.checkpoint writes each shard by its owner. Values that are not tensors are
deep-copied.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

log = logging.getLogger("spotguard.agent")
ALIGN = 64  # bytes: every slice starts aligned for any dtype and for the copy engines


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


class HostBuffers:
    """Reusable host buffers for `take`. Not thread-safe: one snapshot at a time, and the previous
    snapshot must no longer be read (the agent waits for its commit before taking the next)."""

    def __init__(self) -> None:
        self._layout: tuple[tuple[tuple[int, ...], torch.dtype], ...] | None = None
        self._block: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self.pinned = False
        self.bytes = 0
        self.allocations = 0  # how many times buffers were made (1 while the state keeps its shapes)
        self.last_seconds = 0.0  # the last take's stall: copies and the synchronize

    def take(self, state: Any) -> Any:
        """A copy of `state` with every tensor in the host buffers, made now (when this returns, the
        training may change the originals).

        Each tensor's copy is started as the walk over the state finds it, while the state keeps the
        layout the buffers were made for, and the copy of the state's containers is built while the GPU
        copies run: the Python work per tensor (a few microseconds) hides behind the transfer rather than
        adding to it. Where the layout changed, the buffers are made again and every copy started anew."""
        started = time.perf_counter()
        dtensor = _dtensor_type()
        sources: list[torch.Tensor] = []
        devices: set[torch.device] = set()  # the GPUs copied from: each is synchronised at the end
        views = self._views
        fits = True  # every tensor so far has its slice in the current buffers, and its copy started

        def local(t: torch.Tensor) -> torch.Tensor:
            if dtensor is not None and isinstance(t, dtensor):
                return t.to_local()
            if getattr(t, "is_sparse", False) or t.layout != torch.strided:
                raise TypeError("torch_state saves dense tensors and DTensors only")
            if type(t).__name__ == "ShardedTensor":
                raise TypeError("ShardedTensor is not supported: use FSDP2 / DTensor state dicts")
            return t

        def collect(value: Any) -> None:
            nonlocal fits
            if isinstance(value, torch.Tensor):
                src = local(value).detach()
                if src.is_cuda:
                    devices.add(src.device)
                if fits:
                    i = len(sources)
                    if i < len(views) and views[i].shape == src.shape and views[i].dtype == src.dtype:
                        views[i].copy_(src, non_blocking=src.is_cuda)
                    else:
                        fits = False
                sources.append(src)
            elif isinstance(value, dict):
                for v in value.values():
                    collect(v)
            elif isinstance(value, list | tuple):
                for v in value:
                    collect(v)

        try:
            collect(state)
        except BaseException:
            _synchronize(devices)  # the copies started so far end before the buffers can be reused
            raise
        pinned = bool(devices)  # a tensor on a GPU: CUDA is there
        if not (fits and len(sources) == len(views) and pinned == self.pinned):
            # copies already started write into the buffers about to go: they end first
            _synchronize(devices)
            self._ensure([(tuple(t.shape), t.dtype) for t in sources], pinned=pinned)
            for src, dst in zip(sources, self._views, strict=True):
                dst.copy_(src, non_blocking=src.is_cuda)
        copies = iter(self._views)

        def rebuild(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                host = next(copies)
                if dtensor is not None and isinstance(value, dtensor):
                    # DTensor.from_local would move the shard back to the mesh's device: the copy keeps the
                    # original's sharding spec around a host shard instead
                    return dtensor(host, value._spec, requires_grad=False)
                return host
            if isinstance(value, dict):
                return _same_kind(value, {k: rebuild(v) for k, v in value.items()})
            if isinstance(value, list | tuple):
                items = [rebuild(v) for v in value]
                return _same_kind(value, items)
            return copy.deepcopy(value)

        out = rebuild(state)  # views and the values that are not tensors: nothing the copies write
        _synchronize(devices)
        self.last_seconds = time.perf_counter() - started
        return out

    def _ensure(self, layout: list[tuple[tuple[int, ...], torch.dtype]], pinned: bool) -> None:
        key = tuple(layout)
        if key == self._layout and pinned == self.pinned:
            return
        sizes = [_numel(shape) * _element_size(dtype) for shape, dtype in layout]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += -(-size // ALIGN) * ALIGN
        self._views = []
        self._block = None  # let the old block go first
        block, pinned = _host_block(total, pinned)
        views: list[torch.Tensor] = []
        for (shape, dtype), offset, size in zip(layout, offsets, sizes, strict=True):
            if size == 0:
                views.append(torch.empty(shape, dtype=dtype))
                continue
            # a storage of exactly this tensor's bytes (a slice of the block, no copy): serialised alone;
            # the block lives while any copy does
            raw = writable(block)[offset : offset + size]
            views.append(torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape))
        self._block, self._views, self._layout, self.pinned = block, views, key, pinned
        self.bytes = total
        self.allocations += 1


def writable(buffer: torch.Tensor) -> memoryview:
    """A uint8 CPU tensor's bytes as a writable memoryview, which keeps the tensor alive (as do its
    slices, and a tensor torch.frombuffer makes on them)."""
    array = (ctypes.c_ubyte * buffer.numel()).from_address(buffer.data_ptr())
    array.owner = buffer  # type: ignore[attr-defined]
    return memoryview(array).cast("B")


def _synchronize(devices: set[torch.device]) -> None:
    for device in devices:  # the current GPU's, and any other's
        torch.cuda.synchronize(device)


def _host_block(total: int, pinned: bool) -> tuple[torch.Tensor, bool]:
    """A block of exactly `total` bytes of host memory, and whether it is pinned. Pinned by registering
    plain memory with CUDA (as torch.distributed.checkpoint's own staging does) rather than through
    PyTorch's pinned allocator, which rounds every block up to a power of two and caches it: a 13.5 GiB
    state would lock 16 GiB, one just over 16 GiB 32, for as long as the job runs. Unregistered when the
    block goes. Where registering fails, PyTorch's pinned allocator after all."""
    with _unfilled():
        block = torch.empty(max(total, 1), dtype=torch.uint8)
    if not pinned:
        return block, False
    cudart = torch.cuda.cudart()
    address = block.data_ptr()
    code = int(cudart.cudaHostRegister(address, block.numel(), 0))
    if code != 0:
        clear = getattr(cudart, "cudaGetLastError", None)
        if clear is not None:
            clear()  # else the failed call's error is raised at the next kernel launch's check
        log.warning(
            "pinning %d bytes of host memory failed (CUDA error %d): using PyTorch's pinned allocator",
            total,
            code,
        )
        return torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=True), True
    # run as the block is collected, before its memory is freed
    weakref.finalize(block, cudart.cudaHostUnregister, address)
    return block, True


@contextlib.contextmanager
def _unfilled() -> Iterator[None]:
    """New tensors left as they come, also in a job that asked for deterministic algorithms (which fill
    them, a pass over every byte): each take writes every byte a copy holds."""
    deterministic = getattr(torch.utils, "deterministic", None)
    before = getattr(deterministic, "fill_uninitialized_memory", None)
    if deterministic is None or not before:
        yield
        return
    deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        deterministic.fill_uninitialized_memory = before


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _same_kind(original: Any, items: Any) -> Any:
    """`items` as a container of `original`'s type when it can be made so (dict, OrderedDict, list,
    tuple, a named tuple); else as a plain dict, list or tuple."""
    kind: Callable[..., Any] = type(original)
    try:
        if isinstance(original, tuple) and hasattr(original, "_fields"):
            return kind(*items)
        return kind(items)
    except TypeError:
        return dict(items) if isinstance(original, dict) else type(items)(items)


def state_bytes(state: Any) -> int:
    """The bytes of every tensor (every local shard) in `state`."""
    dtensor = _dtensor_type()
    if isinstance(state, torch.Tensor):
        t = state.to_local() if dtensor is not None and isinstance(state, dtensor) else state
        return int(t.numel() * t.element_size())
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0

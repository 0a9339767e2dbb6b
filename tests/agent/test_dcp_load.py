"""The agent's decoding of DCP's stored tensors (spotguard_agent.dcp_load.stored_tensor): a plain tensor
torch.save wrote becomes a view of the bytes read, with no copy, and equals what torch.load makes of
them; anything else goes to torch.load, and a pickle that names anything but a tensor's parts runs
nothing."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest

torch = pytest.importorskip("torch")

from spotguard_agent.dcp_load import _plain_layout, stored_tensor  # noqa: E402


def _saved(value: object) -> bytes:
    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def _owned(data: bytes) -> torch.Tensor:
    owner = torch.empty(len(data), dtype=torch.uint8)
    owner.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return owner


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, size and bytes (float8 and the like have no equality of their own)."""
    bits = lambda t: t.contiguous().flatten().view(torch.uint8)  # noqa: E731
    return a.dtype == b.dtype and a.size() == b.size() and torch.equal(bits(a), bits(b))


def _inside(tensor: torch.Tensor, owner: torch.Tensor) -> bool:
    return owner.data_ptr() <= tensor.data_ptr() < owner.data_ptr() + owner.numel()


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(64, 33),
        lambda: torch.randn(16, 8).to(torch.bfloat16),
        lambda: torch.randn(7).to(torch.float16),
        lambda: torch.arange(10, dtype=torch.int64),
        lambda: torch.tensor([True, False, True]),
        lambda: torch.randn(5, 3, dtype=torch.complex64),
        lambda: torch.randn(12).to(torch.float8_e4m3fn),  # pickled with _rebuild_tensor_v3
        lambda: torch.tensor([1, 2, 60000], dtype=torch.uint16),
        lambda: torch.tensor(3.5),  # 0-dim, as the optimizer's step
        lambda: torch.empty(0, 4),
        lambda: torch.randn(8, 5).t(),  # strides not contiguous
        lambda: torch.randn(100)[10:30:2],  # a view into a larger storage, from an offset
    ],
)
def test_a_plain_tensor_is_a_view_of_the_bytes_read_and_equals_torch_load(make):
    value = make()
    data = _saved(value)
    owner = _owned(data)
    got = stored_tensor(memoryview(data), owner)
    want = torch.load(io.BytesIO(data), weights_only=True)
    assert _same(got, want) and got.stride() == want.stride()
    if got.numel():
        assert _inside(got, owner)  # no copy made
    # without a buffer of its own (a small item in a shared read): an aligned copy, the same tensor
    alone = stored_tensor(memoryview(data))
    assert _same(alone, want)


def test_a_tensor_with_python_state_or_a_subclass_is_left_to_torch_load():
    param = torch.nn.Parameter(torch.randn(3))
    data = _saved(param)
    assert _plain_layout(memoryview(data)) is None
    assert _same(stored_tensor(memoryview(data)), param.detach())


def test_a_pickle_that_names_anything_else_runs_nothing(tmp_path):
    """A zip shaped as torch.save's with a data.pkl that calls os.system: the decoder refuses it
    without calling anything, and torch.load's weights_only refuses it too."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(Evil(), protocol=2))
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/data/0", b"\0" * 16)
        archive.writestr("archive/version", "3\n")
    data = memoryview(stream.getvalue())
    assert _plain_layout(data) is None
    with pytest.raises(pickle.UnpicklingError):
        stored_tensor(data)
    assert not marker.exists()


def test_storage_bounds_the_tensor_cannot_leave_are_checked():
    """A pickle whose tensor would reach past its storage (damage the CRC32 did not see, or a
    forgery) is not viewed over the zip's other bytes."""
    data = bytearray(_saved(torch.arange(4, dtype=torch.int32)))
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    info = archive.getinfo("archive/data.pkl")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    pkl = bytes(data[start : start + info.file_size])
    forged = pkl.replace(b"K\x04\x85", b"K\x09\x85")  # size (4,) -> (9,)
    assert forged != pkl and len(forged) == len(pkl)
    data[start : start + info.file_size] = forged
    assert _plain_layout(memoryview(data)) is None


def test_a_viewed_tensor_has_a_storage_of_its_own_bytes_as_torch_load_makes_it():
    """An RNG state (a uint8 tensor) given to torch.set_rng_state crashed the process (SIGSEGV) when it
    was a view into the item's whole buffer (found by `local run` of examples/train.py): the storage now
    starts at the tensor's bytes and holds only them, as torch.load's does."""
    state = torch.get_rng_state()
    data = _saved(state)
    got = stored_tensor(memoryview(data), _owned(data))
    want = torch.load(io.BytesIO(data), weights_only=True)
    assert got.untyped_storage().nbytes() == want.untyped_storage().nbytes()
    assert got.storage_offset() == want.storage_offset() == 0
    torch.set_rng_state(got)
    assert torch.equal(torch.get_rng_state(), state)


def test_an_empty_tensor_keeps_requires_grad_and_no_result_is_a_view():
    for value in (torch.zeros(0, 3, requires_grad=True), torch.randn(4, 4).t()):
        data = _saved(value)
        got = stored_tensor(memoryview(data), _owned(data))
        want = torch.load(io.BytesIO(data), weights_only=True)
        assert got.requires_grad == want.requires_grad and got._is_view() == want._is_view()


def test_a_pickle_that_is_no_tensors_rebuild_is_left_to_torch_load():
    """A plain 6-tuple where _rebuild_tensor_v2's call should be, and a BINBYTES8 that claims 2**62
    bytes: neither is taken as a layout, and neither escapes as anything but torch.load's own error."""
    for pkl in (
        pickle.dumps((1, 2, 3, 4, 5, 6), protocol=2),
        b"\\x80\\x04\\x8e" + (2**62).to_bytes(8, "little"),
    ):
        stream = io.BytesIO()
        with zipfile.ZipFile(stream, "w") as archive:
            archive.writestr("archive/data.pkl", pkl)
            archive.writestr("archive/byteorder", "little")
            archive.writestr("archive/version", "3\\n")
        assert _plain_layout(memoryview(stream.getvalue())) is None


def test_a_file_read_of_more_blocks_than_one_preadv_takes(tmp_path):
    """A 16 MiB read of many small items (an optimizer's step scalars) is over 1,024 blocks: preadv
    refuses more buffers than IOV_MAX (EINVAL), so the file store reads them in turns."""
    from spotguard_agent.store_file import IOV_MAX, LocalBackend

    body = bytes(range(256)) * (IOV_MAX + 100)
    path = tmp_path / "f"
    path.write_bytes(body)
    views = [memoryview(bytearray(256)) for _ in range(len(body) // 256)]
    assert len(views) > IOV_MAX
    assert LocalBackend(str(tmp_path)).read_range(str(path), 0, views) == len(body)
    assert b"".join(bytes(v) for v in views) == body


def test_a_zip_this_reader_does_not_take_is_left_to_torch_load():
    """The central directory is read by hand (zipfile's generality cost 0.2 ms an item): a zip with a
    comment (or zip64 fields) is not torch.save's as it writes one tensor, and is not taken."""
    stream = io.BytesIO(_saved(torch.arange(5)))
    with zipfile.ZipFile(stream, "a") as archive:
        archive.comment = b"not torch's"
    assert _plain_layout(memoryview(stream.getvalue())) is None
    assert _plain_layout(memoryview(_saved(torch.arange(5)))) is not None

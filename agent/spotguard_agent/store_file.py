"""The file:// backend of the checkpoint store: files under a local directory (such as a mounted EBS
volume that SpotGuard snapshots), copied and fsynced, never through a symbolic link below it."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from spotguard_agent.store_errors import CheckpointDamaged, StoreError

IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024  # buffers a preadv takes


class LocalBackend:
    """Files under a directory (keys are absolute paths below `root`), written durably: what is on the
    disk when the commit returns is what a snapshot of the volume holds. No symbolic link below the root
    is ever followed, reading or writing (every path is walked with O_NOFOLLOW, one directory at a time):
    a link where a checkpoint's file should be is not that file. The root itself may be a link (a mount)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def list_keys(self, prefix: str) -> list[str]:
        if Path(prefix).is_symlink():
            raise StoreError(f"{prefix} is a symbolic link: checkpoints are not read or written through one")
        keys = []
        for directory, _, names in os.walk(prefix):  # does not enter links to directories
            for name in names:
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    if not name.startswith(".tmp-") and stat.S_ISREG(os.lstat(path).st_mode):
                        keys.append(path)
        return sorted(keys)

    def put_files(self, pairs: list[tuple[Path, str]]) -> None:
        for path, key in pairs:
            src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                with self._created(key) as (dst, parent):
                    _copy(src, dst)
                    os.fsync(dst)
                    os.fsync(parent)
            finally:
                os.close(src)

    def put_bytes(self, key: str, body: bytes) -> None:
        name = Path(key).name
        tmp = f".tmp-{name}"
        with self._created(str(Path(key).parent / tmp)) as (fd, parent):
            try:
                _write_all(fd, body)
                os.fsync(fd)
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)  # whole or not at all
                os.fsync(parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise

    def get_bytes(self, key: str) -> bytes:
        with self._opened(key) as fd:
            chunks = []
            while chunk := os.read(fd, _COPY_CHUNK):
                chunks.append(chunk)
            return b"".join(chunks)

    def read_range(self, key: str, start: int, into: list[memoryview]) -> int:
        """Bytes from `start` of `key`, read into each of `into` in turn (one preadv); how many there
        were (fewer when the file is shorter)."""
        got, size = 0, sum(len(v) for v in into)
        with self._opened(key) as fd:
            while got < size and (n := os.preadv(fd, _past(into, got)[:IOV_MAX], start + got)):
                got += n
        return got

    def get_files(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            with self._opened(key) as src:
                dst = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                try:
                    _copy(src, dst)
                finally:
                    os.close(dst)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            Path(key).unlink(missing_ok=True)
        for d in sorted({Path(k).parent for k in keys}, reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()  # an emptied checkpoint directory

    # ----------------------------------------------------------------------- paths without links
    def _parts(self, key: str) -> tuple[list[str], str]:
        *directories, name = Path(key).relative_to(self.root).parts
        return directories, name

    def _directory(self, parts: list[str], create: bool) -> int:
        """A descriptor of root/parts..., opened without following a link below the root."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _opened(self, key: str) -> Iterator[int]:
        """The regular file at `key`, for reading; anything else there is damage to the checkpoint."""
        directories, name = self._parts(key)
        try:
            parent = self._directory(directories, create=False)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
            finally:
                os.close(parent)
        except FileNotFoundError as exc:
            raise CheckpointDamaged(f"{key} is missing") from exc
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CheckpointDamaged(f"{key} is a symbolic link or under one (not followed)") from exc
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointDamaged(f"{key} is not a regular file")
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _created(self, key: str) -> Iterator[tuple[int, int]]:
        """(a new regular file at `key` for writing, its directory): directories on the way are made,
        and a link on the way is an error (ELOOP), never followed."""
        directories, name = self._parts(key)
        parent = self._directory(directories, create=True)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=parent)
            try:
                yield fd, parent
            finally:
                os.close(fd)
        finally:
            os.close(parent)


_COPY_CHUNK = 8 * 1024 * 1024


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy(src: int, dst: int) -> None:
    """All of the file `src` into `dst` (descriptors): in the kernel with sendfile where it can."""
    offset = 0
    try:
        while sent := os.sendfile(dst, src, offset, _COPY_CHUNK):
            offset += sent
        return
    except OSError as exc:
        if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP):
            raise
    while chunk := os.read(src, _COPY_CHUNK):
        _write_all(dst, chunk)


def _past(views: list[memoryview], skip: int) -> list[memoryview]:
    """`views` without their first `skip` bytes (what a short preadv left to read)."""
    out = []
    for v in views:
        if skip >= len(v):
            skip -= len(v)
            continue
        out.append(v[skip:])
        skip = 0
    return out

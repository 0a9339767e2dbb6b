"""The directory a checkpoint is restored into: refused when it is a symbolic link or not a directory,
the checkpoint's files downloaded beside it and verified, and put in place there (by rename, or moved
into a mount point)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from spotguard_agent.manifest import FileEntry, sha256_of
from spotguard_agent.store_errors import CheckpointDamaged, StoreError


def download_verified(
    get_files: Callable[[list[tuple[str, Path]]], None], files: list[tuple[str, FileEntry]], into: Path
) -> None:
    """Each (key, entry) of `files` downloaded by `get_files` into a staging directory beside `into`, its
    size and sha256 checked, and only then the whole put in place at `into`."""
    into.parent.mkdir(parents=True, exist_ok=True)
    # a volume mounted at the target (an EBS volume, a container's mount): staged on it, so that its
    # files move in by rename (across devices they could not)
    mounted = into.is_dir() and os.path.ismount(into)
    staging = Path(tempfile.mkdtemp(prefix=".spotguard-restore-", dir=into if mounted else into.parent))
    try:
        pairs = []
        for key, e in files:
            target = staging / e.path
            target.parent.mkdir(parents=True, exist_ok=True)
            pairs.append((key, target))
        get_files(pairs)
        for _, e in files:
            p = staging / e.path
            if p.stat().st_size != e.size or sha256_of(p) != e.sha256:
                raise CheckpointDamaged(f"{e.path} does not match its manifest")
        _check_target(into)  # again: nothing may have put a link there meanwhile
        _put_in_place(staging, into)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _put_in_place(staging: Path, into: Path) -> None:
    """The restored checkpoint (`staging`) becomes `into`: what was there goes, and the directory is
    replaced by rename; or, when `into` is a mount point (a volume, a bind mount: it cannot be removed),
    it stays and the checkpoint's files move into it."""
    if not into.exists():
        staging.rename(into)
        return
    for child in into.iterdir():
        if child == staging:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    mounted = staging.parent == into  # staged on the volume mounted there
    if not mounted:
        try:
            into.rmdir()
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EPERM, errno.EACCES):
                raise
            mounted = True
    if not mounted:
        staging.rename(into)
        return
    for child in staging.iterdir():  # a mount point: it stays, the files move in (copied when it is
        shutil.move(child, into / child.name)  # another device than the staging's)
    staging.rmdir()


def _check_target(into: Path) -> None:
    if into.is_symlink():
        raise StoreError(f"restore target {into} is a symbolic link: refusing to restore through it")
    if into.exists() and not into.is_dir():
        raise StoreError(f"restore target {into} exists and is not a directory")

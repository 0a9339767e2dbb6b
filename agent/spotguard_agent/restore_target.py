"""The directory a checkpoint is restored into: refused when it is a symbolic link or not a directory,
and the verified checkpoint put in place there (by rename, or moved into a mount point)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from spotguard_agent.store_errors import StoreError


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

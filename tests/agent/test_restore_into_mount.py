"""A checkpoint restored into a directory that is a mount point (an EBS volume mounted at the checkpoint
directory, a container's volume, the local stack's bind mount): the directory cannot be removed or
renamed over (EBUSY), so its contents are replaced in place; from another device they are copied."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from spotguard_agent.restore_target import _put_in_place


def _staged(parent: Path) -> Path:
    staging = parent / ".spotguard-restore-x"
    (staging / "sub").mkdir(parents=True)
    (staging / "state.json").write_text("new")
    (staging / "sub" / "w.pt").write_text("weights")
    return staging


def test_a_plain_directory_is_replaced_whole(tmp_path: Path):
    into = tmp_path / "ckpt"
    into.mkdir()
    (into / "old.txt").write_text("old")
    _put_in_place(_staged(tmp_path), into)
    assert sorted(p.name for p in into.iterdir()) == ["state.json", "sub"]


def test_a_mount_point_keeps_itself_and_gets_the_checkpoints_files(tmp_path: Path, monkeypatch):
    into = tmp_path / "ckpt"
    into.mkdir()
    (into / "old.txt").write_text("old")
    (into / "olddir").mkdir()
    real_rmdir = Path.rmdir

    def busy(self: Path) -> None:
        if self == into:
            raise OSError(errno.EBUSY, "Device or resource busy", str(self))
        real_rmdir(self)

    monkeypatch.setattr(Path, "rmdir", busy)
    staging = _staged(tmp_path)
    _put_in_place(staging, into)
    assert sorted(p.name for p in into.iterdir()) == ["state.json", "sub"]
    assert (into / "sub" / "w.pt").read_text() == "weights" and not staging.exists()


def test_staged_on_the_mounted_volume_itself(tmp_path: Path):
    into = tmp_path / "ckpt"
    into.mkdir()
    (into / "old.txt").write_text("old")
    staging = _staged(into)  # on the volume: its files move in by rename
    _put_in_place(staging, into)
    assert sorted(p.name for p in into.iterdir()) == ["state.json", "sub"] and not staging.exists()


def test_another_error_is_not_taken_for_a_mount_point(tmp_path: Path, monkeypatch):
    into = tmp_path / "ckpt"
    into.mkdir()
    monkeypatch.setattr(Path, "rmdir", lambda self: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        _put_in_place(_staged(tmp_path), into)

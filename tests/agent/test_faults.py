"""Fault injection for the agent's checkpoint store: S3 errors during commit and restore (throttling,
500/503, timeouts, refused connections, lost answers, injected in front of moto server with botocore's
`before-send` hook, so botocore's standard retry mode meets them as it would meet them from S3), a process
killed mid-commit, and a full disk in file:// (EBS) mode.

Every case ends with the same checks, once the fault is gone: the newest committed checkpoint is still
there and restores, byte for byte; nothing committed was deleted; and a half-written sequence (files
without a manifest) is never restored, nor reused by the next commit.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import spotguard_agent.store_file as store_file
from spotguard_agent import CheckpointStore, CheckpointUnavailable
from spotguard_agent.manifest import MANIFEST

from tests.agent.test_store import read, write

FIRST, SECOND = {"w": b"first"}, {"w": b"second"}


def intact(store: CheckpointStore, tmp_path: Path, before: list[int], newest: int, files: dict[str, bytes]):
    """The checks every case ends with (call them once the fault is gone)."""
    committed = store.committed()
    assert set(before) <= set(committed), f"committed checkpoints deleted: {set(before) - set(committed)}"
    assert committed[-1] == newest
    target = tmp_path / f"check-{len(list(tmp_path.glob('check-*')))}"
    m = store.restore(target)
    assert m is not None and m.sequence == newest and read(target) == files
    # The next commit takes a sequence of its own, above any half-written one, and is restored next.
    seen = {int(p.split("checkpoints/")[1].split("/")[0]) for p in _all_keys(store)}
    c = store.commit(write(tmp_path / f"{target.name}-next", {"w": b"next"}), step=99, progress=0.9)
    assert c.manifest.sequence == max(seen) + 1 and store.committed()[-1] == c.manifest.sequence


def _all_keys(store: CheckpointStore) -> list[str]:
    return store.backend.list_keys(f"{store.location.prefix}checkpoints/")


@pytest.fixture
def s3store(faults, bucket, tmp_path) -> CheckpointStore:
    store = CheckpointStore(faults.client, f"s3://{bucket}/jobs/j-1/", keep=3, retry_pause=0.0)
    store.commit(write(tmp_path / "a", FIRST), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", SECOND), step=2, progress=0.2)
    return store


# ----------------------------------------------------------------------------------- S3 commit
@pytest.mark.slow  # the moto server
@pytest.mark.parametrize(
    ("operation", "kind", "times", "key"),
    [
        ("PutObject", "slowdown", 2, "/0000000002/w"),
        ("PutObject", "internal", 2, "/0000000002/w"),
        ("PutObject", "unavailable", 2, f"/0000000002/{MANIFEST}"),
        ("PutObject", "timeout", 2, "/0000000002/w"),
        ("PutObject", "lost", 1, "/0000000002/w"),  # stored, answer lost, sent again
        ("PutObject", "lost", 1, f"/0000000002/{MANIFEST}"),
        ("ListObjectsV2", "slowdown", 2, ""),
    ],
)
def test_a_commit_rides_out_transient_s3_errors(faults, s3store, tmp_path, operation, kind, times, key):
    rule = faults.add(operation, kind, times=times, key=key)
    c = s3store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)
    assert rule.hits == times and c.manifest.sequence == 2
    faults.clear()
    intact(s3store, tmp_path, [0, 1, 2], newest=2, files={"w": b"third"})


@pytest.mark.slow  # the moto server
@pytest.mark.parametrize(
    ("operation", "kind", "key", "newest"),
    [
        ("ListObjectsV2", "unavailable", "", 1),  # nothing written at all
        ("PutObject", "slowdown", "/0000000002/w", 1),  # a file never goes up: no manifest
        ("PutObject", "internal", f"/0000000002/{MANIFEST}", 1),  # files up, manifest refused
        ("PutObject", "connection", f"/0000000002/{MANIFEST}", 1),
        # Every answer to the manifest's PUT lost: the commit fails, yet S3 holds the manifest, written
        # after every file: checkpoint 2 is whole and committed.
        ("PutObject", "lost", f"/0000000002/{MANIFEST}", 2),
    ],
)
def test_a_commit_that_fails_leaves_the_newest_committed_checkpoint_restorable(
    faults, s3store, tmp_path, operation, kind, key, newest
):
    faults.add(operation, kind, key=key)
    with pytest.raises(Exception) as failed:
        s3store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)
    assert "\n" not in str(failed.value).strip()
    faults.clear()
    intact(s3store, tmp_path, [0, 1], newest=newest, files=SECOND if newest == 1 else {"w": b"third"})


@pytest.mark.slow  # the moto server
def test_a_retention_that_fails_leaves_the_commit_standing(faults, bucket, tmp_path):
    store = CheckpointStore(faults.client, f"s3://{bucket}/jobs/j-1/", keep=2, retry_pause=0.0)
    store.commit(write(tmp_path / "a", FIRST), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", SECOND), step=2, progress=0.2)
    rule = faults.add("DeleteObjects", "internal")
    c = store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)  # returns: committed
    assert c.manifest.sequence == 2 and rule.hits >= 1
    faults.clear()
    assert store.committed() == [0, 1, 2]  # nothing deleted, not even half of checkpoint 0
    assert store.restore(tmp_path / "r").sequence == 2
    store.commit(write(tmp_path / "d", {"w": b"fourth"}), step=4, progress=0.4)
    assert store.committed() == [2, 3]  # the next commit's retention catches up


# ---------------------------------------------------------------------------------- S3 restore
@pytest.fixture
def half_written(s3store, faults, bucket):
    """Sequence 2 cut short: its files uploaded, no manifest."""
    faults.client.put_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000002/w", Body=b"half")
    return s3store


@pytest.mark.slow  # the moto server
@pytest.mark.parametrize(
    ("operation", "kind", "key"),
    [
        ("GetObject", "slowdown", "/0000000001/"),
        ("GetObject", "internal", f"/0000000001/{MANIFEST}"),
        ("GetObject", "timeout", "/0000000001/w"),
        ("GetObject", "connection", "/0000000001/w"),
        ("GetObject", "lost", "/0000000001/w"),
        ("HeadObject", "unavailable", "/0000000001/w"),
        ("ListObjectsV2", "slowdown", ""),
    ],
)
def test_a_restore_rides_out_transient_s3_errors(faults, half_written, tmp_path, operation, kind, key):
    # Four failures: more than botocore's three attempts, so the store's own retry is needed as well.
    rule = faults.add(operation, kind, times=4, key=key)
    m = half_written.restore(tmp_path / "r")
    assert rule.hits == 4 and m is not None and m.sequence == 1 and read(tmp_path / "r") == SECOND
    faults.clear()
    intact(half_written, tmp_path, [0, 1], newest=1, files=SECOND)


@pytest.mark.slow  # the moto server
@pytest.mark.parametrize(
    ("operation", "kind", "key"),
    [
        ("GetObject", "slowdown", "/0000000001/"),
        ("GetObject", "unavailable", f"/0000000001/{MANIFEST}"),
        ("GetObject", "timeout", "/0000000001/w"),
        ("GetObject", "connection", ""),
        ("GetObject", "denied", "/0000000001/w"),
        ("HeadObject", "internal", "/0000000001/w"),
        ("ListObjectsV2", "internal", ""),
        ("ListObjectsV2", "nobucket", ""),  # a bucket gone (for now) is not a damaged checkpoint
        ("GetObject", "nobucket", "/0000000001/w"),
    ],
)
def test_a_restore_that_cannot_read_now_fails_loudly_and_deletes_nothing(
    faults, half_written, tmp_path, operation, kind, key
):
    faults.add(operation, kind, key=key)
    write(tmp_path / "r", {"mine": b"keep"})
    with pytest.raises(CheckpointUnavailable, match="cannot be read now") as failed:
        half_written.restore(tmp_path / "r")
    assert "\n" not in str(failed.value)
    assert read(tmp_path / "r") == {"mine": b"keep"}
    assert not list(tmp_path.glob(".spotguard-restore-*"))
    faults.clear()
    intact(half_written, tmp_path, [0, 1], newest=1, files=SECOND)


@pytest.mark.slow  # the moto server
def test_a_file_gone_from_the_newest_is_damage_and_falls_back(faults, half_written, tmp_path):
    faults.add("GetObject", "missing", key="/0000000001/w")  # NoSuchKey: not a "not now"
    m = half_written.restore(tmp_path / "r")
    assert m is not None and m.sequence == 0 and read(tmp_path / "r") == FIRST
    assert half_written.passed_over == {1: "damaged"}
    faults.clear()
    intact(half_written, tmp_path, [0, 1], newest=1, files=SECOND)


# --------------------------------------------------------------------------- killed mid-commit
KILLED_MID_COMMIT = {
    # Files uploaded; the manifest's PUT held until the process is killed.
    "s3": """
        import boto3, sys, time
        from pathlib import Path
        from spotguard_agent import CheckpointStore
        client = boto3.client("s3", endpoint_url=sys.argv[2], region_name="us-east-1")
        def hold(request, **kwargs):
            if "MANIFEST.json" in request.url:
                print("files uploaded", flush=True)
                time.sleep(60)
        client.meta.events.register("before-send.s3.PutObject", hold)
        CheckpointStore(client, sys.argv[1]).commit(Path(sys.argv[3]), step=3, progress=0.3)
    """,
    # Files written and fsynced, the manifest written to its temporary name, not yet renamed into place.
    "file": """
        import os, sys, time
        from pathlib import Path
        from spotguard_agent import CheckpointStore
        def hold(*args, **kwargs):
            print("files written", flush=True)
            time.sleep(60)
        os.replace = hold
        CheckpointStore(None, sys.argv[1]).commit(Path(sys.argv[3]), step=3, progress=0.3)
    """,
}


@pytest.mark.slow  # the moto server, a process killed mid-commit
@pytest.mark.parametrize("mode", ["s3", "file"])
def test_a_process_killed_mid_commit_leaves_no_checkpoint_and_loses_none(
    moto_server, faults, bucket, tmp_path, mode
):
    uri = f"s3://{bucket}/jobs/j-1/" if mode == "s3" else f"file://{tmp_path / 'volume'}/"
    store = CheckpointStore(faults.client if mode == "s3" else None, uri, keep=3, retry_pause=0.0)
    store.commit(write(tmp_path / "a", FIRST), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", SECOND), step=2, progress=0.2)
    big = write(tmp_path / "c", {"w": os.urandom(1 << 20), "x": b"3"})  # two files: all go up first
    script = textwrap.dedent(KILLED_MID_COMMIT[mode])
    proc = subprocess.Popen(
        [sys.executable, "-c", script, uri, moto_server.endpoint, str(big)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("files"), proc.stderr.read() if proc.poll() is not None else line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    half = [k for k in _all_keys(store) if "/0000000002/" in k]
    assert sorted(k.rsplit("/", 1)[1] for k in half) == ["w", "x"]  # all files, no manifest
    assert store.committed() == [0, 1]
    intact(store, tmp_path, [0, 1], newest=1, files=SECOND)


# ----------------------------------------------------------------------- a full disk (file://)
def _full_after(limit: int):
    """A copy (or a write) that writes `limit` bytes, then finds the disk full."""

    def copy(src: int, dst: int) -> None:
        os.write(dst, os.read(src, limit))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write_all(fd: int, data: bytes) -> None:
        os.write(fd, bytes(data[:limit]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return copy, write_all


@pytest.fixture
def volume_store(tmp_path) -> CheckpointStore:
    store = CheckpointStore(None, f"file://{tmp_path / 'volume'}/", keep=3, retry_pause=0.0)
    store.commit(write(tmp_path / "a", FIRST), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", SECOND), step=2, progress=0.2)
    return store


@pytest.mark.parametrize("where", ["a file", "the manifest"])
def test_a_full_disk_during_commit_leaves_the_newest_committed_checkpoint(
    volume_store, tmp_path, monkeypatch, where
):
    copy, write_all = _full_after(3)
    if where == "a file":
        monkeypatch.setattr(store_file, "_copy", copy)
    else:
        monkeypatch.setattr(store_file, "_write_all", write_all)
    with pytest.raises(OSError) as failed:
        volume_store.commit(write(tmp_path / "c", {"w": b"third", "x": b"3"}), step=3, progress=0.3)
    assert failed.value.errno == errno.ENOSPC
    monkeypatch.undo()
    seq = tmp_path / "volume" / "checkpoints" / "0000000002"
    assert not (seq / MANIFEST).exists() and not (seq / f".tmp-{MANIFEST}").exists()
    intact(volume_store, tmp_path, [0, 1], newest=1, files=SECOND)


def test_a_full_disk_during_restore_fails_loudly_rather_than_start_fresh(volume_store, tmp_path, monkeypatch):
    copy, _ = _full_after(2)
    monkeypatch.setattr(store_file, "_copy", copy)  # the restore's staging copy finds no room
    write(tmp_path / "r", {"mine": b"keep"})
    with pytest.raises(CheckpointUnavailable, match=r"checkpoint 1 .*cannot be read now .*No space left"):
        volume_store.restore(tmp_path / "r")
    assert read(tmp_path / "r") == {"mine": b"keep"} and not list(tmp_path.glob(".spotguard-restore-*"))
    monkeypatch.undo()
    intact(volume_store, tmp_path, [0, 1], newest=1, files=SECOND)


def test_a_passing_io_error_on_the_volume_is_retried(volume_store, tmp_path, monkeypatch):
    real, failures = store_file._copy, []

    def flaky(src: int, dst: int) -> None:
        if len(failures) < 2:
            failures.append(1)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(store_file, "_copy", flaky)
    m = volume_store.restore(tmp_path / "r")
    assert len(failures) == 2 and m is not None and m.sequence == 1 and read(tmp_path / "r") == SECOND
    monkeypatch.undo()
    intact(volume_store, tmp_path, [0, 1], newest=1, files=SECOND)

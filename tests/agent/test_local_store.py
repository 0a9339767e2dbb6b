"""Checkpoints in a local directory (file:// URIs), as on a mounted EBS volume that SpotGuard
snapshots: the same contract as on S3, written durably, with the manifest appearing whole or not at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from spotguard_agent import CheckpointStore, StoreError
from spotguard_agent.manifest import MANIFEST

from tests.agent.test_store import read, write
from tests.conftest import REPO


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    return tmp_path / "mnt" / "checkpoints-volume"


@pytest.fixture
def store(volume: Path) -> CheckpointStore:
    return CheckpointStore(None, f"file://{volume}/", keep=2)


def test_round_trip_on_a_local_directory(store, volume, tmp_path):
    files = {"model.pt": os.urandom(5000), "opt/state.bin": b"x" * 10}
    c = store.commit(write(tmp_path / "w", files), step=7, progress=0.5, attempt=1, job_id="j")
    seq = volume / "checkpoints" / "0000000000"
    assert c.uri == f"file://{seq}/{MANIFEST}"
    assert sorted(p.relative_to(seq).as_posix() for p in seq.rglob("*") if p.is_file()) == [
        MANIFEST,
        "model.pt",
        "opt/state.bin",
    ]
    assert not list(volume.rglob(".tmp-*"))  # the manifest was renamed into place
    restored = store.restore(tmp_path / "r")
    assert restored is not None and restored.step == 7 and read(tmp_path / "r") == files
    assert store.newest() == c.uri


def test_half_written_and_damaged_checkpoints_are_never_restored(store, volume, tmp_path):
    store.commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", {"w": b"newer"}), step=2, progress=0.2)
    (volume / "checkpoints" / "0000000001" / "w").write_bytes(b"newer but damaged")
    half = volume / "checkpoints" / "0000000002"  # files written, killed before its manifest
    write(half, {"w": b"half"})
    (half / f".tmp-{MANIFEST}").write_text("{")  # even a manifest cut off mid-write
    restored = store.restore(tmp_path / "r")
    assert restored is not None and restored.step == 1 and read(tmp_path / "r") == {"w": b"good"}
    assert store.committed() == [0, 1]


def test_resume_from_a_file_uri_and_retention(store, volume, tmp_path):
    uris = [
        store.commit(write(tmp_path / f"s{i}", {"w": bytes([i])}), step=i, progress=i / 10).uri
        for i in range(4)
    ]
    assert store.committed() == [2, 3]  # keep=2: older ones deleted, their directories too
    assert sorted(p.name for p in (volume / "checkpoints").iterdir()) == ["0000000002", "0000000003"]
    restored = store.restore(tmp_path / "r", resume_from=uris[2])
    assert restored is not None and restored.step == 2
    with pytest.raises(StoreError, match="is not a manifest under"):
        store.restore(tmp_path / "r", resume_from="file:///elsewhere/checkpoints/0000000002/MANIFEST.json")


@pytest.mark.parametrize("uri", ["file://relative/path/", "file:///no/trailing/slash", "/abs/path/"])
def test_bad_local_uris_are_refused(uri):
    with pytest.raises(StoreError, match="file:///path/"):
        CheckpointStore(None, uri)


@pytest.mark.slow  # a training run as a process, stopped and resumed
def test_a_job_stopped_and_resumed_on_a_local_volume_loses_no_step(tmp_path: Path):
    """examples/count.py with the agent on a file:// checkpoint URI: SIGTERM, exit 75, resume."""
    out = tmp_path / "done.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "SPOTGUARD_CHECKPOINT_URI": f"file://{tmp_path / 'volume'}/",
        "SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": "0.2",
        "SPOTGUARD_WATCH_METADATA": "false",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    cmd = [sys.executable, str(REPO / "examples" / "count.py"), "--steps", "40", "--step-seconds", "0.05"]
    first = subprocess.Popen(
        [*cmd, "--out", str(out)], env={**env, "SPOTGUARD_ATTEMPT": "1"}, stdout=subprocess.PIPE
    )
    assert first.stdout is not None
    for line in first.stdout:  # a few steps in (not a fixed sleep: a loaded machine starts slowly)
        if line.startswith(b"step 5 done"):
            break
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 75
    second = subprocess.run(
        [*cmd, "--out", str(out)], env={**env, "SPOTGUARD_ATTEMPT": "2"}, capture_output=True
    )
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    assert b"resumed after step" in second.stdout
    state = json.loads(out.read_text())
    assert state["next"] == 40 and sum(state["ran"].values()) == 40 and set(state["ran"]) == {"1", "2"}


# ------------------------------------------------------------------------- symbolic links
def _two(store: CheckpointStore, tmp_path: Path) -> Path:
    store.commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", {"w": b"newer"}), step=2, progress=0.2)
    return tmp_path


@pytest.mark.parametrize("what", ["file", "manifest", "sequence directory"])
def test_a_symlink_in_a_checkpoint_is_never_followed(store, volume, tmp_path, what):
    """A link with the very bytes the manifest expects (here a copy of them, placed outside the volume)
    is still not the checkpoint: it is passed over, and the previous good checkpoint restored."""
    _two(store, tmp_path)
    seq = volume / "checkpoints" / "0000000001"
    outside = tmp_path / "outside"
    if what == "sequence directory":
        seq.rename(outside)
        seq.symlink_to(outside, target_is_directory=True)
    else:
        name = "w" if what == "file" else MANIFEST
        outside.mkdir()
        (seq / name).rename(outside / name)
        (seq / name).symlink_to(outside / name)
    restored = store.restore(tmp_path / "r")
    assert restored is not None and restored.step == 1 and read(tmp_path / "r") == {"w": b"good"}


def test_a_restore_target_that_is_a_symlink_is_an_error(store, volume, tmp_path):
    _two(store, tmp_path)
    elsewhere = write(tmp_path / "elsewhere", {"precious": b"x"})
    (tmp_path / "r").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        store.restore(tmp_path / "r")
    assert read(elsewhere) == {"precious": b"x"} and (tmp_path / "r").is_symlink()


def test_a_committed_checkpoint_never_writes_through_a_symlink(store, volume, tmp_path):
    """Files written by a commit land in the volume, even where a link was planted on their path."""
    store.commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    outside = write(tmp_path / "outside", {"w": b"precious"})
    (volume / "checkpoints" / "0000000001").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):
        store.commit(write(tmp_path / "b", {"w": b"newer"}), step=2, progress=0.2)
    assert read(outside) == {"w": b"precious"}
    assert store.restore(tmp_path / "r").step == 1


def test_a_symlinked_checkpoints_directory_is_refused_not_taken_for_empty(store, volume, tmp_path):
    _two(store, tmp_path)
    (volume / "checkpoints").rename(tmp_path / "real")
    (volume / "checkpoints").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        store.restore(tmp_path / "r")
    with pytest.raises(StoreError, match="symbolic link"):
        store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["0000000000", "0000000001"]

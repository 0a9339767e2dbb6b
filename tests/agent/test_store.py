"""Committed checkpoints: manifest last, verified restore, fallback past damage, retention."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from spotguard_agent import CheckpointStore, StoreError
from spotguard_agent.manifest import MANIFEST, Manifest

pytestmark = pytest.mark.slow  # every test talks to the moto server


def write(d: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return d


def read(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def store(s3, bucket):
    return CheckpointStore(s3, f"s3://{bucket}/jobs/j-1/", keep=3)


def test_commit_then_restore_round_trip(store, s3, bucket, tmp_path):
    files = {"model.pt": os.urandom(3000), "opt/state.bin": os.urandom(20), "step.txt": b"42"}
    c = store.commit(write(tmp_path / "w", files), step=42, progress=0.25, attempt=2, job_id="j-1")
    assert c.uri == f"s3://{bucket}/jobs/j-1/checkpoints/0000000000/MANIFEST.json"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [
        f"jobs/j-1/checkpoints/0000000000/{n}"
        for n in ["MANIFEST.json", "model.pt", "opt/state.bin", "step.txt"]
    ]
    m = json.loads(s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read())
    assert (m["step"], m["progress"], m["attempt"], m["job_id"], m["sequence"]) == (42, 0.25, 2, "j-1", 0)
    assert {f["path"]: f["size"] for f in m["files"]} == {
        "model.pt": 3000,
        "opt/state.bin": 20,
        "step.txt": 2,
    }

    restored = store.restore(tmp_path / "r")
    assert isinstance(restored, Manifest) and restored.step == 42
    assert read(tmp_path / "r") == files
    assert store.newest() == c.uri


def test_nothing_to_restore_is_a_fresh_start(store, tmp_path):
    assert store.restore(tmp_path / "r") is None and store.newest() is None


def test_a_checkpoint_without_manifest_does_not_exist(store, s3, bucket, tmp_path):
    store.commit(write(tmp_path / "a", {"w": b"one"}), step=1, progress=0.1)
    # A save cut short by SIGKILL: files of sequence 1 uploaded, no manifest.
    s3.put_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000001/w", Body=b"half")
    assert store.committed() == [0]
    assert store.restore(tmp_path / "r").step == 1 and read(tmp_path / "r") == {"w": b"one"}
    # The next commit does not reuse the half-written sequence.
    c = store.commit(write(tmp_path / "b", {"w": b"three"}), step=3, progress=0.3)
    assert c.manifest.sequence == 2


@pytest.mark.parametrize("damage", ["corrupt", "missing", "truncated", "bad-manifest"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_good_one(store, s3, bucket, tmp_path, damage):
    store.commit(write(tmp_path / "a", {"w": b"good", "x": b"1"}), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", {"w": b"newer", "x": b"2"}), step=2, progress=0.2)
    key = "jobs/j-1/checkpoints/0000000001/w"
    if damage == "corrupt":
        s3.put_object(Bucket=bucket, Key=key, Body=b"NEWER")  # same size, other bytes
    elif damage == "missing":
        s3.delete_object(Bucket=bucket, Key=key)
    elif damage == "truncated":
        s3.put_object(Bucket=bucket, Key=key, Body=b"new")
    else:
        s3.put_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000001/MANIFEST.json", Body=b"{not json")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "stale").write_bytes(b"from before")
    m = store.restore(tmp_path / "r")
    assert m is not None and m.step == 1
    assert read(tmp_path / "r") == {"w": b"good", "x": b"1"}  # exactly the good checkpoint, nothing else


def test_when_every_checkpoint_is_damaged_the_target_is_left_alone(store, s3, bucket, tmp_path):
    store.commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    s3.put_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000000/w", Body=b"evil")
    write(tmp_path / "r", {"mine": b"keep"})
    assert store.restore(tmp_path / "r") is None
    assert read(tmp_path / "r") == {"mine": b"keep"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".spotguard-restore-")]


def test_resume_from_names_the_checkpoint_to_restore(store, tmp_path):
    first = store.commit(write(tmp_path / "a", {"w": b"1"}), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", {"w": b"2"}), step=2, progress=0.2)
    assert store.restore(tmp_path / "r", resume_from=first.uri).step == 1
    with pytest.raises(StoreError):
        store.restore(tmp_path / "r", resume_from="s3://elsewhere/x/MANIFEST.json")


def test_retention_keeps_the_last_n_and_deletes_only_after_a_newer_commit(store, s3, bucket, tmp_path):
    for step in range(5):
        store.commit(write(tmp_path / f"s{step}", {"w": str(step).encode()}), step=step, progress=step / 10)
    assert store.committed() == [2, 3, 4]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert not any("/0000000000/" in k or "/0000000001/" in k for k in keys)
    assert store.restore(tmp_path / "r").step == 4


@pytest.mark.parametrize("path", ["/etc/passwd", "../escape", "a/../../b", "a\\b", MANIFEST])
def test_a_manifest_cannot_write_outside_the_target(store, s3, bucket, tmp_path, path):
    store.commit(write(tmp_path / "a", {"w": b"good"}), step=1, progress=0.1)
    evil = {
        "sequence": 1,
        "step": 9,
        "progress": 0.9,
        "created_at": "2026-11-21T00:00:00Z",
        "files": [{"path": path, "size": 4, "sha256": "0" * 64}],
    }
    s3.put_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000001/MANIFEST.json", Body=json.dumps(evil))
    assert store.restore(tmp_path / "r" / "ckpt").step == 1
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["ckpt"]  # nothing landed beside it


@pytest.mark.parametrize("uri", ["s3://bucket/prefix", "https://bucket/prefix/", "s3://B/x/", "bucket/x/"])
def test_bad_uris_are_refused(s3, uri):
    with pytest.raises(StoreError, match="s3://bucket/prefix/"):
        CheckpointStore(s3, uri)


def test_an_empty_directory_is_not_a_checkpoint(store, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no file"):
        store.commit(tmp_path / "empty", step=0, progress=0.0)


def test_large_files_go_up_in_parts(store, s3, bucket, tmp_path):
    big = os.urandom(40 * 1024 * 1024)  # above the 16 MiB multipart threshold
    c = store.commit(write(tmp_path / "a", {"big.bin": big}), step=1, progress=0.5)
    head = s3.head_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000000/big.bin")
    assert "-" in head["ETag"]  # a multipart upload's ETag
    assert c.throughput_bytes_per_second > 0
    assert store.restore(tmp_path / "r") is not None and (tmp_path / "r" / "big.bin").read_bytes() == big


# ------------------------------------------------------------------ unreadable now is not damaged
def faulty_store(faults, bucket, keep=3):
    store = CheckpointStore(faults.client, f"s3://{bucket}/jobs/j-1/", keep=keep)
    store.retry_pause = 0.0  # the store's own pause between whole-checkpoint retries
    return store


def two_checkpoints(store, tmp_path):
    store.commit(write(tmp_path / "a", {"w": b"first"}), step=1, progress=0.1)
    store.commit(write(tmp_path / "b", {"w": b"second"}), step=2, progress=0.2)


@pytest.mark.parametrize("kind", ["slowdown", "internal", "timeout"])
def test_a_transient_error_during_restore_is_retried_not_taken_for_damage(faults, bucket, tmp_path, kind):
    store = faulty_store(faults, bucket)
    two_checkpoints(store, tmp_path)
    # More failures than botocore's 3 attempts: the store's own retry of the whole checkpoint gets it.
    rule = faults.add("GetObject", kind, times=4, key="/0000000001/")
    m = store.restore(tmp_path / "r")
    assert rule.hits == 4
    assert m is not None and m.sequence == 1 and read(tmp_path / "r") == {"w": b"second"}


@pytest.mark.parametrize("kind", ["slowdown", "unavailable", "internal", "timeout", "connection", "denied"])
def test_a_checkpoint_that_cannot_be_read_now_fails_loudly_instead_of_a_fresh_start(
    faults, bucket, tmp_path, kind
):
    store = faulty_store(faults, bucket)
    two_checkpoints(store, tmp_path)
    faults.add("GetObject", kind)  # every time: S3 does not come back within the retries
    write(tmp_path / "r", {"mine": b"keep"})
    with pytest.raises(StoreError, match=r"checkpoint 1 .*cannot be read now") as failed:
        store.restore(tmp_path / "r")
    assert "\n" not in str(failed.value)
    assert read(tmp_path / "r") == {"mine": b"keep"}  # the target untouched
    faults.clear()  # and once S3 answers again, the newest checkpoint is still there and restorable
    assert store.committed() == [0, 1] and store.restore(tmp_path / "r").sequence == 1


def test_a_listing_that_fails_now_fails_loudly(faults, bucket, tmp_path):
    store = faulty_store(faults, bucket)
    two_checkpoints(store, tmp_path)
    faults.add("ListObjectsV2", "slowdown")
    with pytest.raises(StoreError, match="cannot be read now"):
        store.restore(tmp_path / "r")


# --------------------------------------------------------------------------- retention's guard
def test_retention_keeps_the_restored_and_the_damaged_newer_one_until_keep_commits_past_them(
    store, s3, bucket, tmp_path
):
    store = CheckpointStore(s3, f"s3://{bucket}/jobs/j-1/", keep=2)
    two_checkpoints(store, tmp_path)
    s3.put_object(Bucket=bucket, Key="jobs/j-1/checkpoints/0000000001/w", Body=b"damage")
    assert store.restore(tmp_path / "r").sequence == 0  # 1 is damaged: restored from 0
    store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)
    assert store.committed() == [0, 1, 2]  # the only good older one and the damaged one both stay
    store.commit(write(tmp_path / "d", {"w": b"fourth"}), step=4, progress=0.4)
    assert store.committed() == [2, 3]  # two good commits past them: now they go


def test_retention_keeps_checkpoints_newer_than_resume_from_until_keep_commits_past_them(
    s3, bucket, tmp_path
):
    store = CheckpointStore(s3, f"s3://{bucket}/jobs/j-1/", keep=2)
    two_checkpoints(store, tmp_path)
    first = f"s3://{bucket}/jobs/j-1/checkpoints/0000000000/MANIFEST.json"
    assert store.restore(tmp_path / "r", resume_from=first).sequence == 0
    store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)
    assert store.committed() == [0, 1, 2]
    store.commit(write(tmp_path / "d", {"w": b"fourth"}), step=4, progress=0.4)
    assert store.committed() == [2, 3]


def test_after_a_fresh_start_over_damaged_ones_nothing_goes_before_keep_commits(s3, bucket, tmp_path):
    store = CheckpointStore(s3, f"s3://{bucket}/jobs/j-1/", keep=2)
    two_checkpoints(store, tmp_path)
    for seq in (0, 1):
        s3.put_object(Bucket=bucket, Key=f"jobs/j-1/checkpoints/000000000{seq}/w", Body=b"damage")
    assert store.restore(tmp_path / "r") is None
    store.commit(write(tmp_path / "c", {"w": b"third"}), step=3, progress=0.3)
    assert store.committed() == [0, 1, 2]
    store.commit(write(tmp_path / "d", {"w": b"fourth"}), step=4, progress=0.4)
    assert store.committed() == [2, 3]


@pytest.mark.parametrize(
    "uri",
    [
        "s3://{b}/jobs/j-1/checkpoints/1/MANIFEST.json",  # not the name the agent writes
        "s3://{b}/jobs/j-1/checkpoints/0000000001/../0000000000/MANIFEST.json",
        "s3://{b}/jobs/j-1/../j-2/checkpoints/0000000000/MANIFEST.json",
        "s3://{b}/jobs/j-2/checkpoints/0000000000/MANIFEST.json",
        "s3://{b}/jobs/j-1/checkpoints/0000000000/w",
        "s3://other-bucket/jobs/j-1/checkpoints/0000000000/MANIFEST.json",
    ],
)
def test_resume_from_must_name_a_manifest_of_this_job(store, bucket, tmp_path, uri):
    two_checkpoints(store, tmp_path)
    with pytest.raises(StoreError, match="is not a manifest under"):
        store.restore(tmp_path / "r", resume_from=uri.format(b=bucket))
    assert not (tmp_path / "r").exists()

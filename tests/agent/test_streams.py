"""Checkpoints streamed to S3 as they are written (CheckpointStore.parts): every file goes up in parts
while the writer writes it, with no copy through a local disk, against moto server on 127.0.0.1, with
botocore's retries meeting injected faults. A file is whole in S3 or not there at all: a writer that fails
mid-file, or an upload that fails, leaves no object (the multipart upload aborted) and no manifest, and the
newest committed checkpoint stays the one restored."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from spotguard_agent import Agent, AgentEnv, CheckpointStore
from spotguard_agent.ranks import Ranks
from spotguard_agent.store_s3 import transfer_for

MIB = 1024 * 1024
# S3's smallest part (moto enforces it too): files of a few MiB go up in several parts
SMALL_PARTS = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB, max_concurrency=4)
SMALL_PARTS.max_in_memory_upload_chunks = 4
SMALL_PARTS.max_submission_concurrency = 4


def _store(client: Any, bucket: str, job: str = "j-1") -> CheckpointStore:
    return CheckpointStore(client, f"s3://{bucket}/jobs/{job}/", transfer=SMALL_PARTS, retry_pause=0.0)


def _within(seconds: float, body: Callable[[], Any]) -> Any:
    """body()'s value or error, failing the test if it is still running after `seconds` (a writer or
    an upload left waiting on the other side would hang forever)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = body()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _no_uploads_left(s3: Any, bucket: str) -> bool:
    return not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")


def _keys(s3: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.mark.slow  # the moto server
def test_a_file_streams_up_in_parts_as_it_is_written_and_arrives_whole(s3, bucket, monkeypatch):
    data = os.urandom(12 * MIB + 12345)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: pytest.fail("staged through a local disk"))
    store = _store(s3, bucket)
    with store.parts(3) as parts:
        assert parts.directory is None and parts.open is not None
        with parts.open("big.distcp") as big, parts.open("small") as small:
            for at in range(0, len(data), MIB + 7):  # writes of odd sizes, two files at once
                big.write(memoryview(data)[at : at + MIB + 7])
            small.write(b"tiny")
    key = store.location.key(3, "big.distcp")
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"').endswith("-3")  # 3 parts of 5 MiB
    assert s3.get_object(Bucket=bucket, Key=store.location.key(3, "small"))["Body"].read() == b"tiny"
    assert _no_uploads_left(s3, bucket)


@pytest.mark.slow  # the moto server
def test_a_writer_that_fails_mid_file_leaves_no_object(s3, bucket):
    store = _store(s3, bucket)

    def body() -> None:
        with store.parts(4) as parts, parts.open("cut.distcp") as stream:
            stream.write(os.urandom(11 * MIB))
            raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        _within(60, body)
    assert _keys(s3, bucket) == [] and _no_uploads_left(s3, bucket)


@pytest.mark.slow  # the moto server
@pytest.mark.parametrize("operation", ["UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload"])
def test_an_upload_that_fails_stops_its_writer_with_the_upload_s_own_error(faults, bucket, operation):
    faults.add(operation, "denied")
    store = _store(faults.client, bucket)
    written = []

    def body() -> None:
        with store.parts(5) as parts, parts.open("refused.distcp") as stream:
            for _ in range(200):  # far more than the pipe and the parts in flight hold
                stream.write(os.urandom(MIB))
                written.append(MIB)

    with pytest.raises(Exception, match="AccessDenied") as failed:
        _within(60, body)
    assert "\n" not in str(failed.value).strip()
    if operation != "CompleteMultipartUpload":  # the writer stops soon, not at the end of its file
        assert sum(written) < 100 * MIB
    faults.clear()
    assert _keys(faults.client, bucket) == [] and _no_uploads_left(faults.client, bucket)


@pytest.mark.slow  # the moto server
@pytest.mark.parametrize(("kind", "times"), [("slowdown", 2), ("internal", 2), ("timeout", 1), ("lost", 1)])
def test_a_streamed_part_rides_out_transient_errors(faults, bucket, kind, times):
    rule = faults.add("UploadPart", kind, times=times)
    store = _store(faults.client, bucket)
    data = os.urandom(11 * MIB)
    with store.parts(6) as parts, parts.open("f.distcp") as stream:
        stream.write(data)
    assert rule.hits == times
    key = store.location.key(6, "f.distcp")
    assert faults.client.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_streams_get_a_submission_thread_and_memory_for_every_request_in_flight():
    config = transfer_for(0, 1)
    assert config.max_in_memory_upload_chunks == config.max_request_concurrency == 64
    assert config.max_submission_concurrency == 64
    assert config.preferred_transfer_client == "classic"  # never the CRT client, which reads its own way


# ---------------------------------------------------------------------------- torch_state to S3
torch = pytest.importorskip("torch")


def _agent(client: Any, bucket: str) -> Agent:
    env = AgentEnv.model_validate(
        {"SPOTGUARD_CHECKPOINT_URI": f"s3://{bucket}/jobs/t/", "SPOTGUARD_WRITE_THREADS": "3"}
    )
    store = CheckpointStore(client, env.checkpoint_uri, transfer=SMALL_PARTS, retry_pause=0.0)
    return Agent(env, store, install_signals=False, ranks=Ranks())


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(6)},  # 8 MiB a writer
        "step": seed,
    }


@pytest.mark.slow  # the moto server
def test_a_training_state_goes_straight_to_s3_and_restores_exactly(s3, bucket, tmp_path, monkeypatch):
    from spotguard_agent.torch_state import load, save

    agent = _agent(s3, bucket)
    state = _state(1)
    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkdtemp", lambda *a, **k: pytest.fail("staged through a local disk"))
        save(agent, 10, 0.5, state, sync=True)
    manifest = agent.last.manifest
    assert ".metadata" in {f.path for f in manifest.files} and len(manifest.files) == 5  # 3 writers, blocks
    for f in manifest.files:  # hashed as written: what S3 holds
        body = s3.get_object(Bucket=bucket, Key=agent.store.location.key(manifest.sequence, f.path))
        assert hashlib.sha256(body["Body"].read()).hexdigest() == f.sha256
    assert _no_uploads_left(s3, bucket)
    got = load(_restored(agent, tmp_path))
    assert got["step"] == 1 and all(torch.equal(got["model"][k], state["model"][k]) for k in state["model"])


def _restored(agent: Agent, tmp_path) -> Any:
    target = tmp_path / f"restored-{len(list(tmp_path.iterdir()))}"
    assert agent.store.restore(target) is not None
    return target


@pytest.mark.slow  # the moto server
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the writer's end
@pytest.mark.parametrize("operation", ["UploadPart", "PutObject"])
def test_a_state_whose_upload_fails_is_not_committed_and_the_last_one_stays(
    faults, bucket, tmp_path, operation
):
    """Whichever writer's file fails (DCP's own extra threads end without telling the save), the save
    fails in one line and nothing is committed."""
    from spotguard_agent.torch_state import load, save

    agent = _agent(faults.client, bucket)
    save(agent, 10, 0.5, _state(1), sync=True)
    faults.add(operation, "denied", key="/__0_1.distcp" if operation == "UploadPart" else "/.metadata")
    with pytest.raises(Exception, match="AccessDenied") as failed:
        _within(120, lambda: save(agent, 20, 0.9, _state(2), sync=True))
    assert "\n" not in str(failed.value).strip()
    faults.clear()
    assert agent.store.committed() == [0] and agent.last.manifest.sequence == 0
    assert _no_uploads_left(faults.client, bucket)
    assert load(_restored(agent, tmp_path))["step"] == 1

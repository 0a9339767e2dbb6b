"""The checkpoints function against moto: real checkpoints committed by the agent into the stack's
bucket, their manifest events in, the job's newest committed checkpoint out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from spotguard_agent import CheckpointStore

from spotguard.adapters import clients
from spotguard_cli.emulator.inject import sample
from spotguard_cli.emulator.lambdas import FunctionHost, QueuePoller
from spotguard_cli.emulator.stack import deploy

from .conftest import fresh_aws

pytestmark = pytest.mark.slow  # every test deploys the stack into moto


@pytest.fixture
def stack():
    with fresh_aws():
        st = deploy(None, {"ClusterNames": "gpu-spot"})
        clients.reset()
        host = FunctionHost(st, st.functions["CheckpointsFunction"])
        yield st, host, QueuePoller(st, host)


def manifest_event(bucket: str, key: str) -> str:
    e = sample("checkpoint-manifest")
    e["detail"]["bucket"]["name"] = bucket
    e["detail"]["object"]["key"] = key
    return json.dumps(e)


def commit(store: CheckpointStore, tmp: Path, step: int) -> str:
    d = tmp / f"s{step}"
    d.mkdir()
    (d / "state.bin").write_bytes(random.randbytes(100))
    c = store.commit(d, step=step, progress=step / 100, attempt=1, job_id="j-1")
    return c.uri.split("/", 3)[3]


def committed_metric(printed: str) -> int:
    """The CheckpointsCommitted counts in the EMF lines the function printed."""
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{") and '"_aws"' in line]
    return sum(int(sum(m["CheckpointsCommitted"])) for m in lines if "CheckpointsCommitted" in m)


def test_manifests_record_the_newest_checkpoint_whatever_the_order(stack, tmp_path, capsys):
    st, host, poller = stack
    bucket = st.outputs["CheckpointBucketName"]
    s3, sqs = st.client("s3"), st.client("sqs")
    store = CheckpointStore(s3, f"s3://{bucket}/jobs/j-1/", keep=5)
    keys = [commit(store, tmp_path, step) for step in (10, 20, 30)]
    # a relaunch looks for the newest before the events come: it finds it by listing, and records it
    found = host.module.runtime.service.newest(f"s3://{bucket}/jobs/j-1/")
    assert found is not None and found.sequence == 2
    # S3 -> EventBridge -> the template's rule -> the queue: one event per manifest, none for data files.
    assert poller.drain() == (3, 0)
    # Out of order and repeated, as EventBridge may deliver them; plus a data file's event.
    for key in [keys[2], keys[0], keys[2], keys[1], "jobs/j-1/checkpoints/0000000002/state.bin"]:
        sqs.send_message(QueueUrl=poller.queue_url, MessageBody=manifest_event(bucket, key))
    assert poller.drain() == (5, 0)
    assert committed_metric(capsys.readouterr().out) == 3  # each checkpoint once, however often it came
    newest = host.module.runtime.service.newest(f"s3://{bucket}/jobs/j-1/")
    assert newest is not None and (newest.sequence, newest.step, newest.job_id) == (2, 30, "j-1")
    assert newest.manifest_uri == f"s3://{bucket}/{keys[2]}"


def test_a_bad_manifest_goes_to_the_dead_letter_queue(stack, tmp_path):
    st, host, poller = stack
    bucket = st.outputs["CheckpointBucketName"]
    s3, sqs = st.client("s3"), st.client("sqs")
    key = "jobs/j-2/checkpoints/0000000004/MANIFEST.json"
    s3.put_object(Bucket=bucket, Key=key, Body=b'{"sequence": 4, "step": -1}')  # its event comes by itself
    sqs.send_message(QueueUrl=poller.queue_url, MessageBody="{oops")
    assert poller.drain() == (2, 0)
    dlq = st.outputs["CheckpointsDeadLetterQueueUrl"]
    msgs = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"])[
        "Messages"
    ]
    reasons = sorted(m["MessageAttributes"]["spotguard-reject-reason"]["StringValue"] for m in msgs)
    assert len(reasons) == 2 and any(key in r for r in reasons)
    assert host.module.runtime.ledger.newest_checkpoint(f"s3://{bucket}/jobs/j-2/") is None


def test_without_a_record_the_newest_good_checkpoint_is_found_by_listing(stack, tmp_path):
    st, host, _ = stack
    bucket = st.outputs["CheckpointBucketName"]
    s3 = st.client("s3")
    store = CheckpointStore(s3, f"s3://{bucket}/jobs/j-3/", keep=5)
    commit(store, tmp_path, 1)
    bad = commit(store, tmp_path, 2)
    s3.put_object(Bucket=bucket, Key=bad, Body=b"{}")  # the newest manifest is damaged
    s3.put_object(Bucket=bucket, Key="jobs/j-3/checkpoints/0000000009/state.bin", Body=b"half")  # no manifest
    service = host.module.runtime.service
    found = service.newest(f"s3://{bucket}/jobs/j-3/")
    assert found is not None and (found.sequence, found.step) == (0, 1)
    # ...and it is recorded, so the next look is one read.
    assert host.module.runtime.ledger.newest_checkpoint(f"s3://{bucket}/jobs/j-3/") == found
    assert service.newest(f"s3://{bucket}/jobs/j-none/") is None

"""The smallest reproductions of the defects the properties found, each marked xfail(strict=True) with
the defect until it is fixed (in code this suite does not own). Each input is left out of the property
tests by known_defects.py; when a test here starts to pass, drop its mark and its predicate there."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from spotguard_cli.main import main
from tests.property.harness import PropertyWorld
from tests.property.strategies import dumps


def _one(system: PropertyWorld, queue: str, event: dict) -> tuple[bool, str | None]:
    system.restore()
    (out,) = system.deliver(queue, [dumps(event)])
    return out.failed, out.dead


@pytest.mark.xfail(
    strict=True,
    reason="defect: notices._spot_warning adds 120 s to the event's time; at 9999-12-31T23:59:59Z that "
    "raises OverflowError, which classify does not catch: the record fails (five retries, then the "
    "dead-letter queue without a reason) and `spotguard explain` prints a traceback",
)
def test_a_spot_warning_at_the_end_of_time_is_rejected_not_retried(system: PropertyWorld, tmp_path):
    event = system.sample("spot-interruption-warning")
    event["time"] = "9999-12-31T23:59:59Z"
    failed, dead = _one(system, "interruptions", event)
    f = tmp_path / "late.json"
    f.write_text(json.dumps(event))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["explain", str(f)])
    assert not failed and dead, (failed, dead)
    assert code == 1 and json.loads(out.getvalue())["outcome"] == "reject"


@pytest.mark.xfail(
    strict=True,
    reason="defect: an ECS version (task or container instance event) is an unbounded int; one beyond "
    "DynamoDB's 38 digits makes the ledger write raise decimal.Rounded: the record fails (retried, then "
    "dead-lettered without a reason) instead of being rejected",
)
@pytest.mark.parametrize(
    ("queue", "name"),
    [("task-events", "ecs-task-state-change"), ("interruptions", "ecs-container-instance-state-change")],
)
def test_a_version_beyond_dynamodbs_numbers_is_rejected_not_retried(system: PropertyWorld, queue, name):
    event = system.sample(name)
    event["detail"]["version"] = 10**40
    failed, dead = _one(system, queue, event)
    assert not failed and dead and "version" in dead, (failed, dead)


@pytest.mark.xfail(
    strict=True,
    reason="defect: TaskDetail accepts startedAt (and stoppingAt, stoppedAt, createdAt) without a zone "
    "and copies it into the job; from then on the job's status fails (InternalError: spend() subtracts "
    "a naive time from an aware one)",
)
def test_a_task_event_time_without_a_zone_poisons_no_job(system: PropertyWorld):
    event = system.sample("ecs-task-state-change")
    event["detail"].update(lastStatus="RUNNING", desiredStatus="RUNNING", startedAt="2026-11-21T14:46:03")
    for c in event["detail"]["containers"]:
        c.pop("exitCode", None)
    event["detail"].pop("stoppedAt"), event["detail"].pop("stopCode"), event["detail"].pop("stoppedReason")
    try:
        failed, dead = _one(system, "task-events", event)
        answer = system.jobs.invoke({"action": "status", "job_id": system.job["job_id"]})
    finally:
        system.restore()
    assert not failed
    assert answer["ok"] or dead, answer  # rejected at the door, or read without harm


@pytest.mark.xfail(
    strict=True,
    reason="defect: TaskDetail bounds neither taskArn nor containerInstanceArn; one longer than a "
    "DynamoDB key may be (the task index is keyed HOST#<container instance>/TASK#<task>) makes the "
    "write fail with ValidationException: the record fails (retried) instead of being rejected",
)
@pytest.mark.parametrize("field", ["taskArn", "containerInstanceArn"])
def test_a_task_event_with_an_arn_too_long_for_a_key_is_rejected_not_retried(system: PropertyWorld, field):
    event = system.sample("ecs-task-state-change")
    event["detail"][field] += "x" * 3000
    failed, dead = _one(system, "task-events", event)
    assert not failed and dead, (failed, dead)


@pytest.mark.xfail(
    strict=True,
    reason="defect: the checkpoints function reads the object of any manifest event: one whose manifest "
    "is gone (NoSuchKey: the agent keeps 3 checkpoints, so a late or replayed event finds none) or in "
    "another bucket (NoSuchBucket, AccessDenied, or a name botocore refuses) fails its record, which SQS "
    "retries five times and dead-letters without a reason (and the alarm mails); retrying cannot help",
)
@pytest.mark.parametrize("where", ["a deleted manifest", "another bucket", "a bucket name botocore refuses"])
def test_a_manifest_event_for_no_manifest_is_not_retried(system: PropertyWorld, where):
    event = system.sample("s3-manifest-created")
    d = event["detail"]
    if where == "a deleted manifest":
        d["object"]["key"] = system.checkpoint_key(3)
    else:
        d["bucket"]["name"] = "someone-elses-bucket" if where == "another bucket" else "not a bucket!"
    failed, _ = _one(system, "checkpoints", event)
    assert not failed


@pytest.mark.xfail(
    strict=True,
    reason="defect: the EventBridge envelope's id is not bounded; the notice's ledger key "
    "(NOTICE#<kind>#<id>#<instance>) of an id of a few thousand characters passes DynamoDB's 1,024-byte "
    "sort key limit, the write fails with ValidationException and the record is retried instead of "
    "rejected",
)
def test_an_event_id_too_long_for_a_key_is_rejected_not_retried(system: PropertyWorld):
    event = system.sample("spot-interruption-warning")
    event["id"] = "x" * 3000
    failed, dead = _one(system, "interruptions", event)
    assert not failed and dead, (failed, dead)

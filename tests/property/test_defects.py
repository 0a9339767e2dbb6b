"""The smallest reproductions of the defects the properties found: each was marked xfail(strict=True)
with the defect until it was fixed, and now guards against its return."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from spotguard_cli.main import main
from tests.property.harness import PropertyWorld
from tests.property.strategies import dumps

pytestmark = pytest.mark.slow  # the package's system deploys the stack into moto


def _one(system: PropertyWorld, queue: str, event: dict) -> tuple[bool, str | None]:
    system.restore()
    (out,) = system.deliver(queue, [dumps(event)])
    return out.failed, out.dead


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


@pytest.mark.parametrize(
    ("queue", "name"),
    [("task-events", "ecs-task-state-change"), ("interruptions", "ecs-container-instance-state-change")],
)
def test_a_version_beyond_dynamodbs_numbers_is_rejected_not_retried(system: PropertyWorld, queue, name):
    event = system.sample(name)
    event["detail"]["version"] = 10**40
    failed, dead = _one(system, queue, event)
    assert not failed and dead and "version" in dead, (failed, dead)


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


@pytest.mark.parametrize("field", ["taskArn", "containerInstanceArn"])
def test_a_task_event_with_an_arn_too_long_for_a_key_is_rejected_not_retried(system: PropertyWorld, field):
    event = system.sample("ecs-task-state-change")
    event["detail"][field] += "x" * 3000
    failed, dead = _one(system, "task-events", event)
    assert not failed and dead, (failed, dead)


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


def test_an_event_id_too_long_for_a_key_is_rejected_not_retried(system: PropertyWorld):
    event = system.sample("spot-interruption-warning")
    event["id"] = "x" * 3000
    failed, dead = _one(system, "interruptions", event)
    assert not failed and dead, (failed, dead)
